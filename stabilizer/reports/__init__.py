"""Reports and plots of an execution: its records, the report files, attempt tables, loss and
gradient curves, system usage and tensor-store readings."""
