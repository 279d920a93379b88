"""The directory ``gputop run`` puts first on PYTHONPATH: its ``sitecustomize.py`` loads the
probe into every Python process of the command (see gputop/session/launch.py).

This ``__init__.py`` only makes the directory ship with the package; the directory itself, not
this package, is what goes on PYTHONPATH.
"""
