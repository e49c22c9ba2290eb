"""sandbox: small language models built from pluggable token mixers, trained on synthetic recall tasks."""

__version__ = "0.1.0"
