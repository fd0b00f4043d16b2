#!/usr/bin/env python3
"""CTest's entry for the Python package's tests: exit 77 (CTest: "Not Run") with the reason
where PyTorch, pytest or a CUDA GPU is missing, so that a machine without them never
reports these tests as passed; else pytest's own exit status."""
import os
import sys

try:
    import pytest
    import torch
except ImportError as e:
    print(f"python tests not run: {e.name} is not installed")
    sys.exit(77)
if not torch.cuda.is_available():
    print("python tests not run: no CUDA GPU")
    sys.exit(77)
sys.exit(pytest.main(["-q", "-rs", os.path.dirname(os.path.abspath(__file__))] + sys.argv[1:]))
