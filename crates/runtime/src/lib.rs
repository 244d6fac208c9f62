//! A thin safe wrapper over the PJRT C API: load a plugin, compile StableHLO, move buffers, execute.
