//! Runs a model's forward on a device mesh: weights sharded onto devices, batches in, hook activations out.
