"""CUDA ops, compiled for the tensor's GPU on first use and cached."""

__all__: list[str] = []
