//! Activation shards (safetensors), manifests, statistics and exactly-once uploads to object stores.
