"""A package only so that the Triton tests can import `echo_engine`; Triton ignores it."""
