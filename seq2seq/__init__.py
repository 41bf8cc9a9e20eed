"""seq2seq: encoder-decoder Transformer translation models with PyTorch Lightning."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("seq2seq")
except PackageNotFoundError:  # run from a source tree that was not installed
    __version__ = "0+unknown"
