//! A typed builder that emits StableHLO text with Shardy sharding annotations.
