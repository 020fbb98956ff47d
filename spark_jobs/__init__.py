"""PySpark jobs that run as coordinated consumers (see the Spark issue; not built yet)."""
