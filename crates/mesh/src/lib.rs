//! Named device meshes and partition specs: the vocabulary every other crate uses to talk about sharding.
