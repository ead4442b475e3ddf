"""The transport-neutral core: domain types, request validation, the model manager."""
