"""Input pipelines that feed the enqueue (README "Reading Parquet with
tensorflow-io")."""
