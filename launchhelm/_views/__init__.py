"""Presentation shared by the command line, the IPython magics and the widgets.

How times, durations and statuses read to a person, and the runs table's and
``launchhelm compare``'s rows and text. Stdlib only at import time. Private.
"""
