//! Hand-written mirrors of the parts of XLA's `xla/pjrt/c/pjrt_c_api.h` that siphon calls.
//!
//! Transcribed from the header at API 0.113 (newer than the pinned CPU plugin's 0.106): a
//! plugin accepts argument structs at least as large as its own build's (it ignores trailing
//! fields it does not know) and rejects smaller ones, so the mirrors must be at least as new
//! as the newest plugin siphon loads. Fields only newer plugins read are left zero, which the
//! header defines as "not set".
//!
//! The `PJRT_Api` function table is not mirrored as a struct: a plugin's table may be shorter
//! than ours, and reading a slot past its `struct_size` would read past the plugin's static
//! data. Slots are read one at a time, by index, after checking the table covers them (see
//! [`Slot`] and `Plugin::call`).
#![allow(missing_docs, non_camel_case_types, dead_code)]

use std::ffi::{c_char, c_int, c_void};

/// Opaque handles (never dereferenced on the Rust side).
#[repr(C)]
pub struct PJRT_Error {
    _private: [u8; 0],
}
#[repr(C)]
pub struct PJRT_Client {
    _private: [u8; 0],
}
#[repr(C)]
pub struct PJRT_Device {
    _private: [u8; 0],
}
#[repr(C)]
pub struct PJRT_DeviceDescription {
    _private: [u8; 0],
}
#[repr(C)]
pub struct PJRT_Event {
    _private: [u8; 0],
}
#[repr(C)]
pub struct PJRT_Buffer {
    _private: [u8; 0],
}
#[repr(C)]
pub struct PJRT_Executable {
    _private: [u8; 0],
}
#[repr(C)]
pub struct PJRT_LoadedExecutable {
    _private: [u8; 0],
}
#[repr(C)]
pub struct PJRT_Memory {
    _private: [u8; 0],
}
#[repr(C)]
pub struct PJRT_TopologyDescription {
    _private: [u8; 0],
}

/// The major version these mirrors follow; a plugin with another major is refused.
pub const PJRT_API_MAJOR: i32 = 0;
/// The minor version these mirrors were transcribed from.
pub const PJRT_API_MINOR: i32 = 113;

/// The fixed head of `PJRT_Api`, before the function pointers.
#[repr(C)]
pub struct PJRT_Api_Version {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub major_version: c_int,
    pub minor_version: c_int,
}

#[repr(C)]
pub struct PJRT_Api_Head {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub pjrt_api_version: PJRT_Api_Version,
}

/// Byte offset of function slot 0 in `PJRT_Api`.
pub const API_FIRST_SLOT_OFFSET: usize = std::mem::size_of::<PJRT_Api_Head>();

/// One entry of the `PJRT_Api` function table: its index (order of the header's `PJRT_Api`
/// struct, which only ever grows at the end) and its name for error messages.
#[derive(Debug, Clone, Copy)]
pub struct Slot {
    pub index: usize,
    pub name: &'static str,
}

macro_rules! slots {
    ($($name:ident = $index:expr;)*) => {
        $(pub const $name: Slot = Slot { index: $index, name: concat!("PJRT_", stringify!($name)) };)*
    };
}

#[allow(non_upper_case_globals)]
pub mod slot {
    use super::Slot;
    slots! {
        Error_Destroy = 0;
        Error_Message = 1;
        Error_GetCode = 2;
        Plugin_Initialize = 3;
        Plugin_Attributes = 4;
        Event_Destroy = 5;
        Event_IsReady = 6;
        Event_Error = 7;
        Event_Await = 8;
        Event_OnReady = 9;
        Client_Create = 10;
        Client_Destroy = 11;
        Client_PlatformName = 12;
        Client_ProcessIndex = 13;
        Client_PlatformVersion = 14;
        Client_Devices = 15;
        Client_AddressableDevices = 16;
        Client_LookupDevice = 17;
        Client_LookupAddressableDevice = 18;
        Client_AddressableMemories = 19;
        Client_Compile = 20;
        Client_DefaultDeviceAssignment = 21;
        Client_BufferFromHostBuffer = 22;
        DeviceDescription_Id = 23;
        DeviceDescription_ProcessIndex = 24;
        DeviceDescription_Attributes = 25;
        DeviceDescription_Kind = 26;
        DeviceDescription_DebugString = 27;
        DeviceDescription_ToString = 28;
        Device_GetDescription = 29;
        Device_IsAddressable = 30;
        Device_LocalHardwareId = 31;
        Device_AddressableMemories = 32;
        Device_DefaultMemory = 33;
        Device_MemoryStats = 34;
        Executable_Destroy = 40;
        Executable_Name = 41;
        Executable_NumReplicas = 42;
        Executable_NumPartitions = 43;
        Executable_NumOutputs = 44;
        Executable_SizeOfGeneratedCodeInBytes = 45;
        Executable_GetCostAnalysis = 46;
        Executable_OptimizedProgram = 48;
        LoadedExecutable_Destroy = 50;
        LoadedExecutable_GetExecutable = 51;
        LoadedExecutable_AddressableDevices = 52;
        LoadedExecutable_Delete = 53;
        LoadedExecutable_IsDeleted = 54;
        LoadedExecutable_Execute = 55;
        Buffer_Destroy = 58;
        Buffer_ElementType = 59;
        Buffer_Dimensions = 60;
        Buffer_OnDeviceSizeInBytes = 64;
        Buffer_Device = 65;
        Buffer_ToHostBuffer = 70;
        Buffer_ReadyEvent = 72;
        TopologyDescription_Create = 82;
        TopologyDescription_Destroy = 83;
        TopologyDescription_PlatformName = 84;
        TopologyDescription_GetDeviceDescriptions = 86;
        Compile = 89;
        Executable_OutputElementTypes = 90;
        Executable_OutputDimensions = 91;
        Executable_GetCompiledMemoryStats = 96;
        Client_DmaMap = 110;
        Client_DmaUnmap = 111;
    }
}

// ---------------------------------------------------------------- errors

#[repr(C)]
pub struct PJRT_Error_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub error: *mut PJRT_Error,
}

#[repr(C)]
pub struct PJRT_Error_Message_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub error: *const PJRT_Error,
    pub message: *const c_char,
    pub message_size: usize,
}

#[repr(C)]
pub struct PJRT_Error_GetCode_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub error: *const PJRT_Error,
    pub code: c_int,
}

/// `PJRT_CallbackError`: how a callback we hand to the plugin builds an error for it.
pub type PJRT_CallbackError =
    unsafe extern "C" fn(code: c_int, message: *const c_char, message_size: usize) -> *mut PJRT_Error;

// ---------------------------------------------------------------- named values

pub const NAMED_VALUE_STRING: c_int = 0;
pub const NAMED_VALUE_INT64: c_int = 1;
pub const NAMED_VALUE_INT64_LIST: c_int = 2;
pub const NAMED_VALUE_FLOAT: c_int = 3;
pub const NAMED_VALUE_BOOL: c_int = 4;

#[repr(C)]
#[derive(Clone, Copy)]
pub union PJRT_NamedValue_Value {
    pub string_value: *const c_char,
    pub int64_value: i64,
    pub int64_array_value: *const i64,
    pub float_value: f32,
    pub bool_value: bool,
}

#[repr(C)]
pub struct PJRT_NamedValue {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub name: *const c_char,
    pub name_size: usize,
    pub type_: c_int,
    pub value: PJRT_NamedValue_Value,
    pub value_size: usize,
}

// ---------------------------------------------------------------- plugin

#[repr(C)]
pub struct PJRT_Plugin_Initialize_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
}

#[repr(C)]
pub struct PJRT_Plugin_Attributes_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub attributes: *const PJRT_NamedValue,
    pub num_attributes: usize,
}

// ---------------------------------------------------------------- events

#[repr(C)]
pub struct PJRT_Event_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub event: *mut PJRT_Event,
}

#[repr(C)]
pub struct PJRT_Event_Await_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub event: *mut PJRT_Event,
}

// ---------------------------------------------------------------- key-value callbacks

pub type PJRT_KeyValueGetCallback_ValueDeleter = unsafe extern "C" fn(value: *mut c_char);

#[repr(C)]
pub struct PJRT_KeyValueGetCallback_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub key: *const c_char,
    pub key_size: usize,
    pub timeout_in_ms: c_int,
    pub callback_error: *const PJRT_CallbackError,
    pub user_arg: *mut c_void,
    pub value: *mut c_char,
    pub value_size: usize,
    pub value_deleter_callback: Option<PJRT_KeyValueGetCallback_ValueDeleter>,
}

#[repr(C)]
pub struct PJRT_KeyValueTryGetCallback_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub key: *const c_char,
    pub key_size: usize,
    pub callback_error: *const PJRT_CallbackError,
    pub user_arg: *mut c_void,
    pub value: *mut c_char,
    pub value_size: usize,
    pub value_deleter_callback: Option<PJRT_KeyValueGetCallback_ValueDeleter>,
}

#[repr(C)]
pub struct PJRT_KeyValuePutCallback_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub key: *const c_char,
    pub key_size: usize,
    pub value: *const c_char,
    pub value_size: usize,
    pub callback_error: *const PJRT_CallbackError,
    pub user_arg: *mut c_void,
}

pub type PJRT_KeyValueGetCallback = unsafe extern "C" fn(args: *mut PJRT_KeyValueGetCallback_Args) -> *mut PJRT_Error;
pub type PJRT_KeyValueTryGetCallback =
    unsafe extern "C" fn(args: *mut PJRT_KeyValueTryGetCallback_Args) -> *mut PJRT_Error;
pub type PJRT_KeyValuePutCallback = unsafe extern "C" fn(args: *mut PJRT_KeyValuePutCallback_Args) -> *mut PJRT_Error;

// ---------------------------------------------------------------- client

#[repr(C)]
pub struct PJRT_Client_Create_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub create_options: *const PJRT_NamedValue,
    pub num_options: usize,
    pub kv_get_callback: Option<PJRT_KeyValueGetCallback>,
    pub kv_get_user_arg: *mut c_void,
    pub kv_put_callback: Option<PJRT_KeyValuePutCallback>,
    pub kv_put_user_arg: *mut c_void,
    pub client: *mut PJRT_Client,
    pub kv_try_get_callback: Option<PJRT_KeyValueTryGetCallback>,
    pub kv_try_get_user_arg: *mut c_void,
}

#[repr(C)]
pub struct PJRT_Client_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub client: *mut PJRT_Client,
}

/// Shape of `PJRT_Client_PlatformName_Args` and `PJRT_Client_PlatformVersion_Args`.
#[repr(C)]
pub struct PJRT_Client_String_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub client: *mut PJRT_Client,
    pub value: *const c_char,
    pub value_size: usize,
}

#[repr(C)]
pub struct PJRT_Client_ProcessIndex_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub client: *mut PJRT_Client,
    pub process_index: c_int,
}

/// Shape of `PJRT_Client_Devices_Args` and `PJRT_Client_AddressableDevices_Args`.
#[repr(C)]
pub struct PJRT_Client_Devices_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub client: *mut PJRT_Client,
    pub devices: *const *mut PJRT_Device,
    pub num_devices: usize,
}

#[repr(C)]
pub struct PJRT_Program {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub code: *mut c_char,
    pub code_size: usize,
    pub format: *const c_char,
    pub format_size: usize,
}

#[repr(C)]
pub struct PJRT_Client_Compile_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub client: *mut PJRT_Client,
    pub program: *const PJRT_Program,
    pub compile_options: *const c_char,
    pub compile_options_size: usize,
    pub executable: *mut PJRT_LoadedExecutable,
}

pub const HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL: c_int = 0;
pub const HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES: c_int = 1;

#[repr(C)]
pub struct PJRT_Client_BufferFromHostBuffer_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub client: *mut PJRT_Client,
    pub data: *const c_void,
    pub type_: c_int,
    pub dims: *const i64,
    pub num_dims: usize,
    pub byte_strides: *const i64,
    pub num_byte_strides: usize,
    pub host_buffer_semantics: c_int,
    pub device: *mut PJRT_Device,
    pub memory: *mut PJRT_Memory,
    pub device_layout: *mut c_void,
    pub done_with_host_buffer: *mut PJRT_Event,
    pub buffer: *mut PJRT_Buffer,
}

// ---------------------------------------------------------------- devices

/// Shape of `PJRT_DeviceDescription_Id_Args` and `..._ProcessIndex_Args`.
#[repr(C)]
pub struct PJRT_DeviceDescription_Int_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub device_description: *mut PJRT_DeviceDescription,
    pub value: c_int,
}

#[repr(C)]
pub struct PJRT_DeviceDescription_Kind_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub device_description: *mut PJRT_DeviceDescription,
    pub device_kind: *const c_char,
    pub device_kind_size: usize,
}

#[repr(C)]
pub struct PJRT_Device_GetDescription_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub device: *mut PJRT_Device,
    pub device_description: *mut PJRT_DeviceDescription,
}

#[repr(C)]
pub struct PJRT_Device_IsAddressable_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub device: *mut PJRT_Device,
    pub is_addressable: bool,
}

#[repr(C)]
pub struct PJRT_Device_LocalHardwareId_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub device: *mut PJRT_Device,
    pub local_hardware_id: c_int,
}

/// `PJRT_Device_MemoryStats_Args` as of PJRT 0.115 (the caller's size tells the plugin
/// which fields it may fill; a plugin leaves those it does not report unset).
#[repr(C)]
pub struct PJRT_Device_MemoryStats_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub device: *mut PJRT_Device,
    pub bytes_in_use: i64,
    pub peak_bytes_in_use: i64,
    pub peak_bytes_in_use_is_set: bool,
    pub num_allocs: i64,
    pub num_allocs_is_set: bool,
    pub largest_alloc_size: i64,
    pub largest_alloc_size_is_set: bool,
    pub bytes_limit: i64,
    pub bytes_limit_is_set: bool,
    pub bytes_reserved: i64,
    pub bytes_reserved_is_set: bool,
    pub peak_bytes_reserved: i64,
    pub peak_bytes_reserved_is_set: bool,
    pub bytes_reservable_limit: i64,
    pub bytes_reservable_limit_is_set: bool,
    pub largest_free_block_bytes: i64,
    pub largest_free_block_bytes_is_set: bool,
    pub pool_bytes: i64,
    pub pool_bytes_is_set: bool,
    pub peak_pool_bytes: i64,
    pub peak_pool_bytes_is_set: bool,
}

// ---------------------------------------------------------------- executables

/// Shape of `PJRT_Executable_Destroy_Args` and `PJRT_LoadedExecutable_Destroy_Args`.
#[repr(C)]
pub struct PJRT_Executable_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub executable: *mut c_void,
}

#[repr(C)]
pub struct PJRT_LoadedExecutable_GetExecutable_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub loaded_executable: *mut PJRT_LoadedExecutable,
    pub executable: *mut PJRT_Executable,
}

/// Shape of `PJRT_Executable_NumOutputs_Args`, `..._NumPartitions_Args`, `..._NumReplicas_Args`.
#[repr(C)]
pub struct PJRT_Executable_Count_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub executable: *mut PJRT_Executable,
    pub value: usize,
}

#[repr(C)]
pub struct PJRT_Executable_OutputElementTypes_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub executable: *mut PJRT_Executable,
    pub output_types: *const c_int,
    pub num_output_types: usize,
}

#[repr(C)]
pub struct PJRT_Executable_OutputDimensions_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub executable: *mut PJRT_Executable,
    pub num_outputs: usize,
    pub dims: *const i64,
    pub dim_sizes: *const usize,
}

#[repr(C)]
pub struct PJRT_LoadedExecutable_AddressableDevices_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub executable: *mut PJRT_LoadedExecutable,
    pub addressable_devices: *const *mut PJRT_Device,
    pub num_addressable_devices: usize,
}

#[repr(C)]
pub struct PJRT_ExecuteOptions {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub send_callbacks: *mut c_void,
    pub recv_callbacks: *mut c_void,
    pub num_send_ops: usize,
    pub num_recv_ops: usize,
    pub launch_id: c_int,
    pub non_donatable_input_indices: *const i64,
    pub num_non_donatable_input_indices: usize,
    pub context: *mut c_void,
    pub call_location: *const c_char,
    pub num_tasks: usize,
    pub task_ids: *mut c_int,
    pub incarnation_ids: *mut i64,
    pub multi_slice_config: *mut c_void,
    pub use_major_to_minor_data_layout_for_callbacks: bool,
    pub hlo_output_callbacks: *mut c_void,
    pub num_hlo_output_callbacks: usize,
}

#[repr(C)]
pub struct PJRT_LoadedExecutable_Execute_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub executable: *mut PJRT_LoadedExecutable,
    pub options: *mut PJRT_ExecuteOptions,
    pub argument_lists: *const *const *mut PJRT_Buffer,
    pub num_devices: usize,
    pub num_args: usize,
    pub output_lists: *const *mut *mut PJRT_Buffer,
    pub device_complete_events: *mut *mut PJRT_Event,
    pub execute_device: *mut PJRT_Device,
}

#[repr(C)]
pub struct PJRT_Executable_GetCompiledMemoryStats_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub executable: *mut PJRT_Executable,
    pub generated_code_size_in_bytes: i64,
    pub argument_size_in_bytes: i64,
    pub output_size_in_bytes: i64,
    pub alias_size_in_bytes: i64,
    pub temp_size_in_bytes: i64,
    pub host_generated_code_size_in_bytes: i64,
    pub host_argument_size_in_bytes: i64,
    pub host_output_size_in_bytes: i64,
    pub host_alias_size_in_bytes: i64,
    pub host_temp_size_in_bytes: i64,
    pub peak_memory_in_bytes: i64,
    pub total_size_in_bytes: i64,
    pub total_allocation_bytes: i64,
    pub indefinite_allocations: i64,
    pub peak_unpadded_heap_bytes: i64,
}

// ---------------------------------------------------------------- buffers

#[repr(C)]
pub struct PJRT_Buffer_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub buffer: *mut PJRT_Buffer,
}

#[repr(C)]
pub struct PJRT_Buffer_ElementType_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub buffer: *mut PJRT_Buffer,
    pub type_: c_int,
}

#[repr(C)]
pub struct PJRT_Buffer_Dimensions_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub buffer: *mut PJRT_Buffer,
    pub dims: *const i64,
    pub num_dims: usize,
}

#[repr(C)]
pub struct PJRT_Buffer_OnDeviceSizeInBytes_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub buffer: *mut PJRT_Buffer,
    pub on_device_size_in_bytes: usize,
}

#[repr(C)]
pub struct PJRT_Buffer_Device_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub buffer: *mut PJRT_Buffer,
    pub device: *mut PJRT_Device,
}

#[repr(C)]
pub struct PJRT_Buffer_ReadyEvent_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub buffer: *mut PJRT_Buffer,
    pub event: *mut PJRT_Event,
}

pub const MEMORY_LAYOUT_TILED: c_int = 0;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct PJRT_Buffer_MemoryLayout_Tiled {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub minor_to_major: *const i64,
    pub minor_to_major_size: usize,
    pub tile_dims: *const i64,
    pub tile_dim_sizes: *const usize,
    pub num_tiles: usize,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct PJRT_Buffer_MemoryLayout_Strides {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub byte_strides: *const i64,
    pub num_byte_strides: usize,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union PJRT_Buffer_MemoryLayout_Union {
    pub tiled: PJRT_Buffer_MemoryLayout_Tiled,
    pub strides: PJRT_Buffer_MemoryLayout_Strides,
}

#[repr(C)]
pub struct PJRT_Buffer_MemoryLayout {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub layout: PJRT_Buffer_MemoryLayout_Union,
    pub type_: c_int,
}

#[repr(C)]
pub struct PJRT_Buffer_ToHostBuffer_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub src: *mut PJRT_Buffer,
    pub host_layout: *mut PJRT_Buffer_MemoryLayout,
    pub dst: *mut c_void,
    pub dst_size: usize,
    pub event: *mut PJRT_Event,
}

// ---------------------------------------------------------------- DMA mapping (API 0.67)

#[repr(C)]
pub struct PJRT_Client_DmaMap_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub client: *mut PJRT_Client,
    pub data: *mut c_void,
    pub size: usize,
}

#[repr(C)]
pub struct PJRT_Client_DmaUnmap_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub client: *mut PJRT_Client,
    pub data: *mut c_void,
}

// ---------------------------------------------------------------- topologies (compiling without devices)

#[repr(C)]
pub struct PJRT_TopologyDescription_Create_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub topology_name: *const c_char,
    pub topology_name_size: usize,
    pub create_options: *const PJRT_NamedValue,
    pub num_options: usize,
    pub topology: *mut PJRT_TopologyDescription,
}

#[repr(C)]
pub struct PJRT_TopologyDescription_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub topology: *mut PJRT_TopologyDescription,
}

#[repr(C)]
pub struct PJRT_TopologyDescription_PlatformName_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub topology: *const PJRT_TopologyDescription,
    pub platform_name: *const c_char,
    pub platform_name_size: usize,
}

#[repr(C)]
pub struct PJRT_TopologyDescription_GetDeviceDescriptions_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub topology: *const PJRT_TopologyDescription,
    pub descriptions: *const *mut PJRT_DeviceDescription,
    pub num_descriptions: usize,
}

#[repr(C)]
pub struct PJRT_Compile_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub topology: *const PJRT_TopologyDescription,
    pub program: *const PJRT_Program,
    pub compile_options: *const c_char,
    pub compile_options_size: usize,
    pub client: *mut PJRT_Client,
    pub executable: *mut PJRT_Executable,
}

#[repr(C)]
pub struct PJRT_Executable_OptimizedProgram_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub executable: *mut PJRT_Executable,
    pub program: *mut PJRT_Program,
}

#[repr(C)]
pub struct PJRT_Executable_GetCostAnalysis_Args {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub executable: *mut PJRT_Executable,
    pub num_properties: usize,
    pub properties: *const PJRT_NamedValue,
}

/// Marks the `#[repr(C)]` argument structs above: each starts with `size_t struct_size`,
/// the field [`crate::plugin::Plugin::call`] fills in.
///
/// # Safety
/// Implementors must be `#[repr(C)]` structs whose first field is a `usize` struct size and
/// whose every field is valid when all bytes are zero.
pub unsafe trait ArgsStruct: Sized {}

macro_rules! args_structs {
    ($($t:ty),* $(,)?) => {
        // SAFETY: every listed struct is #[repr(C)], starts with `struct_size: usize`, and holds
        // only raw pointers, integers, bools, unions of those and `Option<fn>`, all of which
        // are valid when zeroed.
        $(unsafe impl ArgsStruct for $t {})*
    };
}

args_structs!(
    PJRT_Error_Destroy_Args,
    PJRT_Error_Message_Args,
    PJRT_Error_GetCode_Args,
    PJRT_Plugin_Initialize_Args,
    PJRT_Plugin_Attributes_Args,
    PJRT_Event_Destroy_Args,
    PJRT_Event_Await_Args,
    PJRT_KeyValueGetCallback_Args,
    PJRT_KeyValueTryGetCallback_Args,
    PJRT_KeyValuePutCallback_Args,
    PJRT_Client_Create_Args,
    PJRT_Client_Destroy_Args,
    PJRT_Client_String_Args,
    PJRT_Client_ProcessIndex_Args,
    PJRT_Client_Devices_Args,
    PJRT_Client_Compile_Args,
    PJRT_Client_BufferFromHostBuffer_Args,
    PJRT_DeviceDescription_Int_Args,
    PJRT_DeviceDescription_Kind_Args,
    PJRT_Device_GetDescription_Args,
    PJRT_Device_IsAddressable_Args,
    PJRT_Device_LocalHardwareId_Args,
    PJRT_Device_MemoryStats_Args,
    PJRT_Executable_Destroy_Args,
    PJRT_LoadedExecutable_GetExecutable_Args,
    PJRT_Executable_Count_Args,
    PJRT_LoadedExecutable_AddressableDevices_Args,
    PJRT_Executable_OutputElementTypes_Args,
    PJRT_Executable_OutputDimensions_Args,
    PJRT_LoadedExecutable_Execute_Args,
    PJRT_Executable_GetCompiledMemoryStats_Args,
    PJRT_Buffer_Destroy_Args,
    PJRT_Buffer_ElementType_Args,
    PJRT_Buffer_Dimensions_Args,
    PJRT_Buffer_OnDeviceSizeInBytes_Args,
    PJRT_Buffer_Device_Args,
    PJRT_Buffer_ReadyEvent_Args,
    PJRT_Buffer_ToHostBuffer_Args,
    PJRT_Client_DmaMap_Args,
    PJRT_Client_DmaUnmap_Args,
    PJRT_TopologyDescription_Create_Args,
    PJRT_TopologyDescription_Destroy_Args,
    PJRT_TopologyDescription_PlatformName_Args,
    PJRT_TopologyDescription_GetDeviceDescriptions_Args,
    PJRT_Compile_Args,
    PJRT_Executable_GetCostAnalysis_Args,
    PJRT_Executable_OptimizedProgram_Args,
);

/// A zeroed argument struct (every field "not set"), ready for `Plugin::call`.
pub fn zeroed<A: ArgsStruct>() -> A {
    // SAFETY: `ArgsStruct` guarantees all-zero bytes are a valid value.
    unsafe { std::mem::zeroed() }
}

/// A zeroed plain struct that is not an argument struct (named values, execute options).
pub fn zeroed_plain<T: PlainStruct>() -> T {
    // SAFETY: `PlainStruct` guarantees all-zero bytes are a valid value.
    unsafe { std::mem::zeroed() }
}

/// # Safety
/// Implementors must be valid when all bytes are zero.
pub unsafe trait PlainStruct: Sized {}
// SAFETY: pointers, integers, a bool and a union of those; zero is valid for each.
unsafe impl PlainStruct for PJRT_NamedValue {}
// SAFETY: as above.
unsafe impl PlainStruct for PJRT_ExecuteOptions {}
// SAFETY: as above.
unsafe impl PlainStruct for PJRT_Program {}
// SAFETY: as above.
unsafe impl PlainStruct for PJRT_Buffer_MemoryLayout {}

// Sizes and offsets from the header on x86_64/aarch64 (LP64). A wrong transcription would
// make the plugin read the wrong field; these catch it at compile time.
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<PJRT_Api_Head>() == 40);
    assert!(size_of::<PJRT_Error_Message_Args>() == 40);
    assert!(size_of::<PJRT_NamedValue>() == 56);
    assert!(offset_of!(PJRT_NamedValue, value) == 40);
    assert!(size_of::<PJRT_Plugin_Attributes_Args>() == 32);
    assert!(size_of::<PJRT_KeyValueGetCallback_Args>() == 80);
    assert!(size_of::<PJRT_KeyValueTryGetCallback_Args>() == 72);
    assert!(size_of::<PJRT_KeyValuePutCallback_Args>() == 64);
    // The pinned plugin's own size is 88 ("expected 88, got 72" with the older layout).
    assert!(size_of::<PJRT_Client_Create_Args>() == 88);
    assert!(offset_of!(PJRT_Client_Create_Args, client) == 64);
    assert!(size_of::<PJRT_Program>() == 48);
    assert!(size_of::<PJRT_Client_Compile_Args>() == 56);
    assert!(size_of::<PJRT_Client_BufferFromHostBuffer_Args>() == 120);
    assert!(offset_of!(PJRT_Client_BufferFromHostBuffer_Args, host_buffer_semantics) == 72);
    assert!(offset_of!(PJRT_Client_BufferFromHostBuffer_Args, buffer) == 112);
    assert!(size_of::<PJRT_ExecuteOptions>() == 144);
    assert!(offset_of!(PJRT_ExecuteOptions, launch_id) == 48);
    assert!(size_of::<PJRT_LoadedExecutable_Execute_Args>() == 80);
    assert!(size_of::<PJRT_Executable_GetCompiledMemoryStats_Args>() == 144);
    assert!(size_of::<PJRT_Buffer_ToHostBuffer_Args>() == 56);
    assert!(size_of::<PJRT_Buffer_MemoryLayout_Tiled>() == 56);
    assert!(size_of::<PJRT_Buffer_MemoryLayout>() == 80);
    assert!(offset_of!(PJRT_Buffer_MemoryLayout, type_) == 72);
    assert!(size_of::<PJRT_Device_IsAddressable_Args>() == 32);
    assert!(offset_of!(PJRT_Device_MemoryStats_Args, bytes_limit) == 80);
    assert!(offset_of!(PJRT_Device_MemoryStats_Args, peak_pool_bytes_is_set) == 184);
    // The sizes both pinned plugins (CPU 0.106, CUDA 0.115) check.
    assert!(size_of::<PJRT_Client_DmaMap_Args>() == 40);
    assert!(size_of::<PJRT_Client_DmaUnmap_Args>() == 32);
    assert!(size_of::<PJRT_TopologyDescription_Create_Args>() == 56);
    assert!(size_of::<PJRT_TopologyDescription_GetDeviceDescriptions_Args>() == 40);
    assert!(size_of::<PJRT_Compile_Args>() == 64);
    assert!(size_of::<PJRT_Executable_GetCostAnalysis_Args>() == 40);
    assert!(size_of::<PJRT_Executable_OptimizedProgram_Args>() == 32);
};
