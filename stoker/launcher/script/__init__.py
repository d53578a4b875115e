"""The job script: what one submission launches (`spec.py`) and the sbatch script
rendered from it (`render.py`, Jinja2 imported only when it renders). A lowest wing."""
