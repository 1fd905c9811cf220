"""The service's core: the loops, the ports they take and the domain types those speak. It imports
no adapter, no operator tool and no database driver (tests/unit/test_layout.py)."""
