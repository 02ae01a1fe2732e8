"""sdq: run Mixture-of-Experts GGUF models larger than RAM by paging routed experts from SSD."""

__version__ = "0.1.0"
