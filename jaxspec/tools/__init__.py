"""What the command-line, measurement, training and data layers share (docs/layers.md): reading inputs
(`inputs`: text files, TSVs, corpora, encoding), batching over `generate` (`batching`: buckets, per-item seeds,
`generate_all`), writing outputs (`outputs`: atomic writes, resumable line files, markdown tables, progress bars).

It imports the public core only; nothing below it imports it.
"""
