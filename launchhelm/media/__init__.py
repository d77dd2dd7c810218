"""Images, tables and histograms a run logs beside its numbers (see docs/storage.md, "Media")."""

from launchhelm.media._read import MediaItem, TableImage
from launchhelm.media._types import Histogram, Image, Media, Table

__all__ = ["Histogram", "Image", "Media", "MediaItem", "Table", "TableImage"]
