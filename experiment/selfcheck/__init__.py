"""The first command on a new machine (selfcheck.py): every attention path's errors, speed and
memory, and auto's choice: what to measure (plan.py), one cell of it (measure.py), the run in
order within its time budget and its exit status (check.py), written as a table (table.py)."""
