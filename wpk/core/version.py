"""The version of wpk (stored in every plan and shown by `wpk --version`)."""

__version__ = "0.1.0"
