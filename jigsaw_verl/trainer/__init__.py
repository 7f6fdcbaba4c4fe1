"""verl trainer integration (the verl layer): trainer modes registered with verl's V1 trainer registry."""
