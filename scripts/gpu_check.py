"""The prepared GPU check: two processes stand in for two pipelines' workers on one device (torch only).

It measures what multiplexing relies on and the CPU cannot show:

(a) **Residency.** Process A holds a model of ``--params`` parameters in fp32 with its gradients and Adam's two
    moments (after one optimizer step), as verl's FSDP2 actor does on one rank, then offloads all of it to pinned
    host memory the way verl's ``offload_fsdp_model_to_cpu`` / ``offload_fsdp_optimizer`` do (tensors moved to the
    CPU, the caching allocator emptied). It reports the bytes the device got back (``torch.cuda.mem_get_info``
    before and after), how long offload and onload took, and whether process B could then really allocate that
    memory (B allocates 95 % of it while A is offloaded).
(b) **Interference.** A memory-bound decode-like loop (GEMV over a weight matrix far larger than the L2 cache, as a
    long-tail decode step streams its weights) in A and a compute-bound training-like loop (large GEMMs) in B: each
    one's speed alone, then both at once time-sliced (no MPS), and, where CUDA MPS can be started
    (``nvidia-cuda-mps-control``), at every SM share of :data:`SHARES` through ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``.

Output (``--out``, JSON): the interference table's file format (``jigsaw-interference/1``, readable by
``jigsaw_verl.policy.jigsaw.interference.InterferenceTable.load``: the ``memory|compute`` pair at each MPS share;
no shares when MPS could not be started) plus ``residency``, ``time_sliced`` and the machine's description. On the
CPU (``--device cpu``, for the tests) it runs the same code in a reduced form: small sizes, host memory, no MPS.
Run it on a GPU machine once (under 5 minutes on an H100/H200) and commit the result with the machine's name::

    python scripts/gpu_check.py --out shared/gpu_check_h200.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time

import torch
import torch.multiprocessing as mp

SHARES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
FORMAT = "jigsaw-interference/1"  # jigsaw_verl.policy.jigsaw.interference.FORMAT (this script imports only torch)
ADAM_MOMENTS = 2


# ---- sizes --------------------------------------------------------------------------------------------------
def _sizes(device: str, reduced: bool, params: float) -> dict:
    if device == "cpu" or reduced:
        return {"params": min(params, 2e6), "hidden": 256, "gemv": 1024, "gemm": 256, "seconds": 1.0}
    return {"params": params, "hidden": 4096, "gemv": 16384, "gemm": 8192, "seconds": 5.0}


def _free_bytes(device: str) -> float | None:
    if device == "cpu":
        return None
    torch.cuda.synchronize()
    return float(torch.cuda.mem_get_info()[0])


# ---- (a) residency ------------------------------------------------------------------------------------------
def _model(params: float, hidden: int, device: str) -> torch.nn.Module:
    layers = max(1, int(params // (hidden * hidden)))
    return torch.nn.Sequential(*[torch.nn.Linear(hidden, hidden, bias=False) for _ in range(layers)]).to(device)


def _move(model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: str) -> None:
    """Parameters, gradients and optimizer state to ``device`` (pinned when it is the host and a GPU is there)."""
    pin = device == "cpu" and torch.cuda.is_available()
    for p in model.parameters():
        p.data = p.data.to(device, non_blocking=True)
        if pin:
            p.data = p.data.pin_memory()
        if p.grad is not None:
            p.grad = p.grad.to(device, non_blocking=True)
    for state in optimizer.state.values():
        for k, v in state.items():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                state[k] = v.to(device, non_blocking=True)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        if device == "cpu":
            torch.cuda.empty_cache()


def _holder(device: str, sizes: dict, to_b, from_b, results) -> None:
    """Process A of (a): hold, offload, let B allocate, onload."""
    torch.manual_seed(0)
    model = _model(sizes["params"], sizes["hidden"], device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    model(torch.randn(8, sizes["hidden"], device=device)).square().mean().backward()
    optimizer.step()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    state = params * (2 + ADAM_MOMENTS)  # parameters, gradients, two moments
    before = _free_bytes(device)
    started = time.perf_counter()
    _move(model, optimizer, "cpu")
    offload_s = time.perf_counter() - started
    after = _free_bytes(device)
    freed = state if before is None else after - before
    to_b.put(freed)
    allocated = from_b.get()
    started = time.perf_counter()
    _move(model, optimizer, device)
    onload_s = time.perf_counter() - started
    results.put({"params": sum(p.numel() for p in model.parameters()), "state_bytes": float(state),
                 "freed_bytes": float(freed), "freed_measured": before is not None, "offload_s": offload_s,
                 "onload_s": onload_s, "other_process_allocated": allocated})  # fmt: skip


def _taker(device: str, from_a, to_a) -> None:
    """Process B of (a): allocate 95 % of what A freed while A is offloaded."""
    freed = from_a.get()
    try:
        block = torch.empty(int(0.95 * freed) // 4, dtype=torch.float32, device=device)
        block.fill_(1.0)
        ok = bool(block[-1].item() == 1.0)
        del block
        if device != "cpu":
            torch.cuda.empty_cache()
    except torch.OutOfMemoryError:
        ok = False
    to_a.put(ok)


def residency(device: str, sizes: dict) -> dict:
    ctx = mp.get_context("spawn")
    a_to_b, b_to_a, results = ctx.Queue(), ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_holder, args=(device, sizes, a_to_b, b_to_a, results)),
             ctx.Process(target=_taker, args=(device, a_to_b, b_to_a))]  # fmt: skip
    for p in procs:
        p.start()
    out = results.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
    return out


# ---- (b) interference ---------------------------------------------------------------------------------------
def _loop(kind: str, device: str, sizes: dict, start, results) -> None:
    """One stand-in stage: ``memory`` (GEMV over a big weight) or ``compute`` (square GEMMs); iterations/s."""
    torch.set_num_threads(1)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    n = sizes["gemv"] if kind == "memory" else sizes["gemm"]
    w = torch.randn(n, n, device=device, dtype=dtype)
    x = torch.randn(n, 1 if kind == "memory" else n, device=device, dtype=dtype)
    for _ in range(3):  # warm-up
        y = w @ x
    if device != "cpu":
        torch.cuda.synchronize()
    start.wait()
    iters, started = 0, time.perf_counter()
    while time.perf_counter() - started < sizes["seconds"]:
        for _ in range(10):
            y = w @ x
        if device != "cpu":
            torch.cuda.synchronize()
        iters += 10
    results.put((kind, iters / (time.perf_counter() - started), float(y.float().abs().mean())))


def _run_loops(kinds: list[str], device: str, sizes: dict, env: dict[str, dict] | None = None) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    procs = []
    for kind in kinds:
        saved = dict(os.environ)
        os.environ.update((env or {}).get(kind, {}))  # spawn copies the environment as it is now
        procs.append(ctx.Process(target=_loop, args=(kind, device, sizes, start, results)))
        procs[-1].start()
        os.environ.clear()
        os.environ.update(saved)
    time.sleep(1.0 if device == "cpu" else 5.0)  # both built and warmed up
    start.set()
    out = {}
    for _ in kinds:
        kind, rate, _ = results.get(timeout=600)
        out[kind] = rate
    for p in procs:
        p.join(timeout=60)
    return out


def _mps(action: str) -> bool:
    tool = shutil.which("nvidia-cuda-mps-control")
    if tool is None:
        return False
    if action == "start":
        return subprocess.run([tool, "-d"], capture_output=True).returncode == 0
    subprocess.run([tool], input=b"quit\n", capture_output=True)
    return True


def interference(device: str, sizes: dict) -> tuple[dict, list]:
    """``(time_sliced, mps_rows)``: speeds as fractions of alone; one ``[memory, compute]`` row per MPS share."""
    alone = {k: _run_loops([k], device, sizes)[k] for k in ("memory", "compute")}
    both = _run_loops(["memory", "compute"], device, sizes)
    sliced = {"alone_iters_per_s": alone, **{k: both[k] / alone[k] for k in alone}}
    rows = []
    if device != "cpu" and _mps("start"):
        try:
            for s in SHARES:
                env = {"memory": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(round(100 * s))},
                       "compute": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(round(100 * (1 - s)))}}  # fmt: skip
                r = _run_loops(["memory", "compute"], device, sizes, env)
                rows.append([min(1.0, r["memory"] / alone["memory"]), min(1.0, r["compute"] / alone["compute"])])
        finally:
            _mps("stop")
    return sliced, rows


def machine(device: str) -> dict:
    info = {"host": platform.node(), "python": sys.version.split()[0], "torch": torch.__version__, "device": device}
    if device != "cpu":
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, memory_bytes=float(props.total_memory), sms=props.multi_processor_count)
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--reduced", action="store_true", help="small sizes (the CPU test's form)")
    parser.add_argument("--params", type=float, default=1e9, help="model parameters for the residency check")
    parser.add_argument("--out", default="gpu_check.json", help="JSON file to write")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device (use --device cpu for the reduced CPU form)")
    sizes = _sizes(args.device, args.reduced, args.params)
    started = time.perf_counter()
    print(f"gpu_check: residency of {sizes['params']:.3g} parameters with Adam on {args.device}", flush=True)
    held = residency(args.device, sizes)
    print(f"gpu_check: freed {held['freed_bytes'] / 2**30:.2f} GiB in {held['offload_s']:.2f} s", flush=True)
    sliced, rows = interference(args.device, sizes)
    result = {
        "format": FORMAT,
        "gpu": machine(args.device).get("gpu", "cpu"),
        "shares": list(SHARES) if rows else [],
        "classes": ["compute", "memory"],
        "rates": {"memory|compute": rows} if rows else {},
        "residency": held,
        "time_sliced": sliced,
        "mps": bool(rows),
        "machine": machine(args.device),
        "wall_s": time.perf_counter() - started,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"gpu_check: wrote {args.out} in {result['wall_s']:.0f} s (MPS {'measured' if rows else 'not available'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
