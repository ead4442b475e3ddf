"""Development scripts. A package so that tests can import `scripts.demo_model.quality`."""
