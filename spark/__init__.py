"""PySpark data source `warren`, reading streams over the network."""
