"""Console capture: what a run's process prints, kept beside its metrics.

The session tees stdout and stderr (file descriptors where it can, Python
streams in notebooks) into chunks under ``runs/<run>/console/``; readers
page them back for ``RunHandle.console`` and ``launchhelm logs``. Private.
"""
