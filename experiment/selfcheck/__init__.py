"""The first command on a new machine (selfcheck.py): every attention path's errors, speed and
memory, and auto's choice (check.py), written as a table (table.py)."""
