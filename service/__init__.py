"""vramd: one daemon that owns a machine's accelerator memory and runs local AI runtimes."""

__version__ = "0.1.0"
