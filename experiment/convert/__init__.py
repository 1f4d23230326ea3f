"""Run folders from and to other formats: a Hugging Face checkpoint as a run at step 0 and a run
as a Hugging Face checkpoint (hf.py)."""
