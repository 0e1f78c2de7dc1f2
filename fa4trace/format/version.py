"""fa4trace's version: one place for the wheel's metadata, ``fa4trace.__version__`` and every
bundle's ``fa4trace_version``; a leaf, so the layers that stamp it need not import the package."""

__version__ = "0.1.0"
