"""Input pipelines that feed the enqueue (docs/guides/parquet.md: "Reading
Parquet with tensorflow-io")."""
