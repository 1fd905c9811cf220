"""SQL shipped inside the package as `worker.sql`: migrations and named queries."""
