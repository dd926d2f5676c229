"""mucsc: Model Update Compression by Soft Clustering."""
