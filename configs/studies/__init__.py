"""Studies of imported models, one file each: python study.py configs/studies/NAME.py (experiment/study/)."""
