"""flink-reconciler: a pull-based GitOps reconciler for Apache Flink applications."""

__version__ = "0.1.0"
