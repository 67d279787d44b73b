"""A small chat app: SandboxMiddleware, one host tool, the run viewer, and an authorize callback per thread."""
