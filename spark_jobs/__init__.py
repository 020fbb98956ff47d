"""PySpark jobs that run as coordinated consumers.

- `spark_jobs.session`: the environment Spark needs on a plain machine (Java, Python, loopback)
  and a local session builder shared by the jobs, the tests and the benchmarks.
"""
