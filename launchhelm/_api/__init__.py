"""The query API: what notebooks, widgets and the CLI read runs through.

- :mod:`._client`: :class:`Api`, the entry point (projects, the runs table, many runs' history).
- :mod:`._handle`: :class:`RunHandle`, one run as stored (status, checkpoints, control, history,
  console), and :class:`RunView`, what its ``poll`` reads in one go.
- :mod:`._project`: many runs of a project at once (:func:`read_project`, :func:`settled_views`),
  settled ones from the project's history dataset.
"""

from launchhelm._api._client import Api
from launchhelm._api._handle import RunHandle, RunView
from launchhelm._api._project import ProjectRun, read_project, settled_views
from launchhelm._metrics._project import ProjectReader

__all__ = ["Api", "ProjectReader", "ProjectRun", "RunHandle", "RunView", "read_project", "settled_views"]
