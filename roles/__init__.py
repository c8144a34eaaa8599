"""The roles a stack can have. `__main__.py` picks one from the stack's config; each role composes infra/ and
workloads/ (which is why roles live beside them, not inside infra/: workloads/ imports infra/, never the reverse)."""
