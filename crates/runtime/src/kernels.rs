//! Registering siphon's kernels ([`siphon_kernels::KERNELS`]) of a plugin's platform with its
//! FFI extension (`xla/pjrt/c/pjrt_c_api_ffi_extension.h`), so that programs may name them in
//! `stablehlo.custom_call`.

use std::ffi::c_void;

use crate::error::Result;
use crate::ffi;
use crate::plugin::Plugin;
pub(crate) use siphon_kernels::Platform;

impl Plugin {
    /// Whether siphon's kernels of `platform` (`siphon-kernels`) are registered with this
    /// plugin's FFI extension, registering them on the first call (a CPU or CUDA client's
    /// creation makes it); false where the plugin has no such extension or registration
    /// failed (logged).
    pub fn kernels(&self, platform: Platform) -> bool {
        *self.kernels.get_or_init(|| {
            register(self, platform).unwrap_or_else(|err| {
                tracing::warn!("siphon's {platform:?} kernels not registered with {}: {err}", self.path().display());
                false
            })
        })
    }
}

/// `PJRT_Extension_Base`.
#[repr(C)]
struct ExtensionBase {
    struct_size: usize,
    kind: i32,
    next: *const ExtensionBase,
}

/// `PJRT_Extension_Type_FFI`.
const EXTENSION_FFI: i32 = 5;

/// `PJRT_FFI_Register_Handler_Args` (typed handlers only; the plugins of API 0.106 and later).
#[repr(C)]
struct RegisterHandlerArgs {
    struct_size: usize,
    target_name: *const u8,
    target_name_size: usize,
    handler: *const c_void,
    platform_name: *const u8,
    platform_name_size: usize,
    traits: u32,
}

type RegisterHandler = unsafe extern "C" fn(*mut RegisterHandlerArgs) -> *mut ffi::PJRT_Error;

/// `PJRT_FFI_Extension`.
#[repr(C)]
struct FfiExtension {
    base: ExtensionBase,
    type_id_register: *const c_void,
    user_data_add: *const c_void,
    register_handler: Option<RegisterHandler>,
}

// Sizes from the header on LP64, as `ffi.rs` checks its own.
const _: () = {
    use std::mem::size_of;
    assert!(size_of::<ExtensionBase>() == 24);
    assert!(size_of::<RegisterHandlerArgs>() == 56);
    assert!(size_of::<FfiExtension>() == 48);
};

/// The oldest PJRT API whose FFI extension takes [`RegisterHandlerArgs`] as laid out here
/// (older ones had an `api_version` field in it).
const MIN_MINOR: i32 = 106;

/// Registers every kernel of `platform` with `plugin`'s FFI extension; `Ok(false)` where the
/// plugin has none or an older layout of it.
pub(crate) fn register(plugin: &Plugin, platform: Platform) -> Result<bool> {
    if plugin.api_version().1 < MIN_MINOR {
        return Ok(false);
    }
    // SAFETY: `PJRT_Api` starts with `PJRT_Api_Head`, whose extension chain holds valid
    // extensions that live as long as the plugin.
    let mut ext = unsafe { (*(plugin.api() as *const ffi::PJRT_Api_Head)).extension_start as *const ExtensionBase };
    while !ext.is_null() {
        // SAFETY: see above.
        let base = unsafe { &*ext };
        if base.kind == EXTENSION_FFI && base.struct_size >= std::mem::size_of::<FfiExtension>() {
            // SAFETY: an FFI extension of at least our size has our layout.
            let Some(register_handler) = (unsafe { &*(ext as *const FfiExtension) }).register_handler else {
                return Ok(false);
            };
            let name = platform.name();
            for kernel in siphon_kernels::KERNELS.iter().filter(|k| k.platform == platform) {
                let mut args = RegisterHandlerArgs {
                    struct_size: std::mem::size_of::<RegisterHandlerArgs>(),
                    target_name: kernel.name.as_ptr(),
                    target_name_size: kernel.name.len(),
                    handler: kernel.handler as *const c_void,
                    platform_name: name.as_ptr(),
                    platform_name_size: name.len(),
                    traits: 0,
                };
                // SAFETY: the args match the extension's function; XLA copies the names.
                let err = unsafe { register_handler(&mut args) };
                if !err.is_null() {
                    return Err(plugin.take_error("PJRT_FFI_Register_Handler", err));
                }
            }
            return Ok(true);
        }
        ext = base.next;
    }
    Ok(false)
}
