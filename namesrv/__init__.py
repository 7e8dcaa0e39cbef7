"""namesrv: see docs/architecture.md (not built yet)."""
