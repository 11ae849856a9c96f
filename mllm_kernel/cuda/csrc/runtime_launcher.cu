// The raw runtime's launcher: loads CUBIN/PTX images through tvm-ffi's CubinModule and
// launches their extern "C" kernels with arguments checked and packed here, in C++, from
// the parameter kinds Python parsed out of the kernel's signature. Python passes its
// arguments straight through (tvm-ffi converts tensors through DLPack), so a launch costs
// one tvm-ffi call: no Python loop over the arguments or their bytes.
//
// Exports (see mllm_kernel/cuda/runtime/native.py):
//   load_image(image)                    -> a CudaLibrary object (the loaded image)
//   get_kernel(library, name, kinds, labels, grid, block, shared_mem) -> launch function
//   launch(grid, block, shared_mem, stream, *args) -> the device index it launched on
//   pack_arguments(kinds, labels, args)  -> the parameter bytes a launch would pass
//   synchronize(device, stream, whole_device)
//   device_properties(device)            -> {attribute name: value}

// The runtime API flavour of the launcher (cudaLibrary*, CUDA 12.8+): libcudart is all
// the module links, and an older toolkit fails here with the header's own message.
#define TVM_FFI_CUBIN_LAUNCHER_USE_DRIVER_API 0

#include <tvm/ffi/big_int.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/cuda/cubin_launcher.h>
#include <tvm/ffi/extra/cuda/device_guard.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/object.h>
#include <tvm/ffi/string.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "mllm_kernel/utils.hpp"

namespace mllm_kernel::cuda::runtime {

namespace ffi = ::tvm::ffi;

// ---------------------------------------------------------------------------
// Errors: raised without a C++ source location, since they describe the caller's
// arguments, not this file.
// ---------------------------------------------------------------------------
template <typename... Args>
[[noreturn]] void raise(const char* kind, Args&&... args) {
  throw ffi::Error(kind, detail::concat(std::forward<Args>(args)...), std::string());
}

std::string cuda_error_text(cudaError_t status) {
  return detail::concat(cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
}

// ---------------------------------------------------------------------------
// Parameter kinds: the names Python's signature parser emits.
// ---------------------------------------------------------------------------
enum class Kind : uint8_t {
  kPointer,
  kBool,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUInt8,
  kUInt16,
  kUInt32,
  kUInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
};

struct ScalarName {
  const char* name;
  Kind kind;
  DLDataType dtype;
};

constexpr std::array<ScalarName, 13> kScalars{{
    {"bool", Kind::kBool, {kDLBool, 8, 1}},
    {"int8", Kind::kInt8, {kDLInt, 8, 1}},
    {"int16", Kind::kInt16, {kDLInt, 16, 1}},
    {"int32", Kind::kInt32, {kDLInt, 32, 1}},
    {"int64", Kind::kInt64, {kDLInt, 64, 1}},
    {"uint8", Kind::kUInt8, {kDLUInt, 8, 1}},
    {"uint16", Kind::kUInt16, {kDLUInt, 16, 1}},
    {"uint32", Kind::kUInt32, {kDLUInt, 32, 1}},
    {"uint64", Kind::kUInt64, {kDLUInt, 64, 1}},
    {"float16", Kind::kFloat16, {kDLFloat, 16, 1}},
    {"bfloat16", Kind::kBFloat16, {kDLBfloat, 16, 1}},
    {"float32", Kind::kFloat32, {kDLFloat, 32, 1}},
    {"float64", Kind::kFloat64, {kDLFloat, 64, 1}},
}};

const ScalarName* find_scalar(const std::string& name) {
  for (const ScalarName& scalar : kScalars) {
    if (name == scalar.name) return &scalar;
  }
  return nullptr;
}

/// One kernel parameter: its kind, for pointers the dtype a tensor must have (when the
/// pointee is a known scalar type), and its label for errors ("argument 'n' (int)").
struct Param {
  Kind kind = Kind::kPointer;
  bool check_dtype = false;
  DLDataType dtype{};
  std::string label;
};

/// "pointer", "pointer:float32" or a scalar name (see kScalars).
Param parse_param(const std::string& kind, std::string label) {
  Param param;
  param.label = std::move(label);
  constexpr const char kPointer[] = "pointer";
  if (kind.rfind(kPointer, 0) == 0) {
    if (kind.size() > sizeof(kPointer) - 1) {
      const ScalarName* pointee = find_scalar(kind.substr(sizeof(kPointer)));
      if (kind[sizeof(kPointer) - 1] != ':' || pointee == nullptr) {
        raise("ValueError", param.label, ": unknown parameter kind '", kind, "'");
      }
      param.check_dtype = true;
      param.dtype = pointee->dtype;
    }
    return param;
  }
  const ScalarName* scalar = find_scalar(kind);
  if (scalar == nullptr) raise("ValueError", param.label, ": unknown parameter kind '", kind, "'");
  param.kind = scalar->kind;
  return param;
}

std::vector<Param> parse_params(const ffi::Array<ffi::String>& kinds,
                                const ffi::Array<ffi::String>& labels) {
  if (kinds.size() != labels.size()) {
    raise("ValueError", "got ", kinds.size(), " parameter kinds but ", labels.size(), " labels");
  }
  std::vector<Param> params;
  params.reserve(kinds.size());
  for (size_t i = 0; i < kinds.size(); ++i) {
    params.push_back(parse_param(std::string(kinds[i]), std::string(labels[i])));
  }
  return params;
}

// ---------------------------------------------------------------------------
// Argument conversion: each argument into an 8-byte slot, with range checks.
// ---------------------------------------------------------------------------

/// What a converted Python value came in as, for "expected ..., got ..." messages.
std::string describe(const ffi::AnyView& arg) {
  switch (arg.type_index()) {
    case ffi::TypeIndex::kTVMFFINone: return "None";
    case ffi::TypeIndex::kTVMFFIInt:
    case ffi::TypeIndex::kTVMFFIBigInt: return "int";
    case ffi::TypeIndex::kTVMFFIBool: return "bool";
    case ffi::TypeIndex::kTVMFFIFloat: return "float";
    case ffi::TypeIndex::kTVMFFIDLTensorPtr:
    case ffi::TypeIndex::kTVMFFITensor: return "a tensor";
    case ffi::TypeIndex::kTVMFFIStr:
    case ffi::TypeIndex::kTVMFFISmallStr:
    case ffi::TypeIndex::kTVMFFIRawStr: return "str";
    case ffi::TypeIndex::kTVMFFIBytes:
    case ffi::TypeIndex::kTVMFFISmallBytes:
    case ffi::TypeIndex::kTVMFFIByteArrayPtr: return "bytes";
    case ffi::TypeIndex::kTVMFFIArray:
    case ffi::TypeIndex::kTVMFFIList: return "a list or tuple";
    case ffi::TypeIndex::kTVMFFIOpaquePyObject: return "a Python object tvm-ffi does not convert";
    default: return arg.GetTypeKey();
  }
}

/// The integer value of `arg` as (value, is it a uint64 above INT64_MAX).
struct IntValue {
  int64_t value;
  uint64_t big;  // set when the value only fits uint64
  bool is_big;
};

IntValue int_value(const ffi::AnyView& arg, const Param& param, const char* ctype_kind) {
  switch (arg.type_index()) {
    case ffi::TypeIndex::kTVMFFIInt: return {arg.cast<int64_t>(), 0, false};
    case ffi::TypeIndex::kTVMFFIBool: return {arg.cast<bool>() ? 1 : 0, 0, false};
    case ffi::TypeIndex::kTVMFFIBigInt: {
      const std::optional<uint64_t> big = arg.cast<ffi::BigInt>().as<uint64_t>();
      if (!big) raise("OverflowError", param.label, ": the int does not fit in 64 bits");
      return {0, *big, true};
    }
    default: raise("TypeError", param.label, ": expected ", ctype_kind, ", got ", describe(arg));
  }
}

template <typename T>
T checked_int(const ffi::AnyView& arg, const Param& param) {
  const IntValue v = int_value(arg, param, "an int");
  using Limits = std::numeric_limits<T>;
  bool fits;
  if (v.is_big) {
    fits = std::is_same_v<T, uint64_t>;
  } else if constexpr (std::is_signed_v<T>) {
    fits = v.value >= Limits::min() && v.value <= Limits::max();
  } else {
    fits = v.value >= 0 && static_cast<uint64_t>(v.value) <= Limits::max();
  }
  if (!fits) {
    const std::string shown = v.is_big ? std::to_string(v.big) : std::to_string(v.value);
    raise("OverflowError", param.label, ": ", shown, " does not fit (the range is ",
          std::to_string(Limits::min()), "..", std::to_string(Limits::max()), ")");
  }
  return v.is_big ? static_cast<T>(v.big) : static_cast<T>(v.value);
}

double float_value(const ffi::AnyView& arg, const Param& param) {
  switch (arg.type_index()) {
    case ffi::TypeIndex::kTVMFFIFloat: return arg.cast<double>();
    case ffi::TypeIndex::kTVMFFIInt:
    case ffi::TypeIndex::kTVMFFIBool: return static_cast<double>(arg.cast<int64_t>());
    default: raise("TypeError", param.label, ": expected a float or an int, got ", describe(arg));
  }
}

/// `converted` is `value` rounded to the parameter's type; a finite value that became
/// infinite did not fit.
void check_finite_fit(double value, double converted, const Param& param) {
  if (std::isinf(converted) && std::isfinite(value)) {
    raise("OverflowError", param.label, ": ", value, " is out of the type's range");
  }
}

bool bool_value(const ffi::AnyView& arg, const Param& param) {
  const IntValue v = int_value(arg, param, "a bool");
  if (v.is_big || (v.value != 0 && v.value != 1)) {
    raise("OverflowError", param.label, ": ",
          v.is_big ? std::to_string(v.big) : std::to_string(v.value), " is not a bool (0 or 1)");
  }
  return v.value != 0;
}

template <typename T>
void store(uint64_t* slot, T value) {
  static_assert(sizeof(T) <= sizeof(uint64_t));
  std::memcpy(slot, &value, sizeof(T));
}

/// Up to kMaxParams arguments, packed for cudaLaunchKernel: `pointers[i]` points at
/// `slots[i]`, which holds parameter i's value. `device` is the GPU of the tensors
/// (-1 when no tensor was passed).
constexpr int kMaxParams = 256;

struct PackedArgs {
  std::array<uint64_t, kMaxParams> slots;
  std::array<void*, kMaxParams> pointers;
  int device = -1;
  const Param* device_param = nullptr;
};

void pack_pointer(const ffi::AnyView& arg, const Param& param, uint64_t* slot, PackedArgs& out) {
  if (arg.type_index() == ffi::TypeIndex::kTVMFFINone) {
    store<void*>(slot, nullptr);
    return;
  }
  const std::optional<ffi::TensorView> tensor = arg.try_cast<ffi::TensorView>();
  if (!tensor) {
    raise("TypeError", param.label,
          ": expected a CUDA tensor (torch, CuPy, JAX or any DLPack array), a NumPy array or "
          "None, got ",
          describe(arg));
  }
  const DLDevice device = tensor->device();
  if (device.device_type != kDLCUDA) {
    raise("ValueError", param.label, ": expected a CUDA tensor, got one on ", device_name(device),
          " (move it to the GPU first; NumPy arrays are copied for you)");
  }
  if (out.device < 0) {
    out.device = device.device_id;
    out.device_param = &param;
  } else if (device.device_id != out.device) {
    raise("ValueError", param.label, ": is on cuda:", device.device_id, " but ",
          out.device_param->label, " is on cuda:", out.device,
          "; every tensor of a launch must be on the GPU the kernel runs on");
  }
  if (param.check_dtype && !same_dtype(tensor->dtype(), param.dtype)) {
    raise("TypeError", param.label, ": expected a ", dtype_name(param.dtype), " tensor, got a ",
          dtype_name(tensor->dtype()), " one");
  }
  store<void*>(slot, static_cast<char*>(tensor->data_ptr()) + tensor->byte_offset());
}

void pack_one(const ffi::AnyView& arg, const Param& param, uint64_t* slot, PackedArgs& out) {
  switch (param.kind) {
    case Kind::kPointer: pack_pointer(arg, param, slot, out); break;
    case Kind::kBool: store(slot, bool_value(arg, param)); break;
    case Kind::kInt8: store(slot, checked_int<int8_t>(arg, param)); break;
    case Kind::kInt16: store(slot, checked_int<int16_t>(arg, param)); break;
    case Kind::kInt32: store(slot, checked_int<int32_t>(arg, param)); break;
    case Kind::kInt64: store(slot, checked_int<int64_t>(arg, param)); break;
    case Kind::kUInt8: store(slot, checked_int<uint8_t>(arg, param)); break;
    case Kind::kUInt16: store(slot, checked_int<uint16_t>(arg, param)); break;
    case Kind::kUInt32: store(slot, checked_int<uint32_t>(arg, param)); break;
    case Kind::kUInt64: store(slot, checked_int<uint64_t>(arg, param)); break;
    case Kind::kFloat16: {
      const double value = float_value(arg, param);
      const __half half = __double2half(value);
      check_finite_fit(value, __half2float(half), param);
      store(slot, half);
      break;
    }
    case Kind::kBFloat16: {
      const double value = float_value(arg, param);
      const __nv_bfloat16 bf16 = __double2bfloat16(value);
      check_finite_fit(value, __bfloat162float(bf16), param);
      store(slot, bf16);
      break;
    }
    case Kind::kFloat32: {
      const double value = float_value(arg, param);
      const auto single = static_cast<float>(value);
      check_finite_fit(value, single, param);
      store(slot, single);
      break;
    }
    case Kind::kFloat64: store(slot, float_value(arg, param)); break;
  }
}

std::string parameter_list(const std::vector<Param>& params) {
  std::string text;
  for (const Param& param : params) text += (text.empty() ? "" : ", ") + param.label;
  return text;
}

void pack(const std::vector<Param>& params, const ffi::AnyView* args, int num_args,
          const std::string& kernel, PackedArgs& out) {
  if (num_args != static_cast<int>(params.size())) {
    raise("TypeError", "kernel '", kernel, "' takes ", params.size(), " arguments (",
          parameter_list(params), "), got ", num_args);
  }
  for (int i = 0; i < num_args; ++i) {
    out.pointers[i] = &out.slots[i];
    out.slots[i] = 0;  // narrow values leave the rest of their slot zero
    pack_one(args[i], params[i], &out.slots[i], out);
  }
}

// ---------------------------------------------------------------------------
// Launch configuration: grid and block as an int or 1-3 ints, shared memory in bytes.
// ---------------------------------------------------------------------------
struct Dims {
  ffi::dim3 value;
  bool given = false;
};

unsigned positive_dim(int64_t value, const char* what) {
  if (value < 1 || value > std::numeric_limits<uint32_t>::max()) {
    raise("ValueError", what, " sizes must be between 1 and 2^32-1, got ", value);
  }
  return static_cast<unsigned>(value);
}

/// None -> `fallback`; an int -> (n, 1, 1); a sequence of 1 to 3 ints.
Dims parse_dims(const ffi::AnyView& arg, const char* what, const Dims& fallback) {
  switch (arg.type_index()) {
    case ffi::TypeIndex::kTVMFFINone: return fallback;
    case ffi::TypeIndex::kTVMFFIInt:
      return {ffi::dim3(positive_dim(arg.cast<int64_t>(), what)), true};
    default: break;
  }
  const std::optional<ffi::Array<int64_t>> dims = arg.try_cast<ffi::Array<int64_t>>();
  if (!dims) {
    raise("TypeError", what, " must be an int or a tuple of 1 to 3 ints, got ", describe(arg));
  }
  if (dims->empty() || dims->size() > 3) {
    raise("ValueError", what, " must have 1 to 3 sizes (x, y, z), got ", dims->size());
  }
  std::array<unsigned, 3> xyz{1, 1, 1};
  for (size_t i = 0; i < dims->size(); ++i) xyz[i] = positive_dim((*dims)[i], what);
  return {ffi::dim3(xyz[0], xyz[1], xyz[2]), true};
}

int64_t checked_shared_mem(int64_t bytes) {
  if (bytes < 0 || bytes > std::numeric_limits<int32_t>::max()) {
    raise("ValueError", "shared_mem must be between 0 and 2^31-1 bytes, got ", bytes);
  }
  return bytes;
}

int64_t parse_shared_mem(const ffi::AnyView& arg, int64_t fallback) {
  if (arg.type_index() == ffi::TypeIndex::kTVMFFINone) return fallback;
  if (arg.type_index() != ffi::TypeIndex::kTVMFFIInt) {
    raise("TypeError", "shared_mem must be an int (bytes), got ", describe(arg));
  }
  return checked_shared_mem(arg.cast<int64_t>());
}

/// None -> the stream the caller's framework has current on `device` (tvm-ffi sets it
/// from torch for the call); an int or a __cuda_stream__ object -> that cudaStream_t.
cudaStream_t parse_stream(const ffi::AnyView& arg, int device) {
  switch (arg.type_index()) {
    case ffi::TypeIndex::kTVMFFINone:
      return static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, device));
    case ffi::TypeIndex::kTVMFFIOpaquePtr: return static_cast<cudaStream_t>(arg.cast<void*>());
    case ffi::TypeIndex::kTVMFFIInt:
      return reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(arg.cast<int64_t>()));
    default:
      raise("TypeError",
            "stream must be a torch.cuda.Stream (or any object with __cuda_stream__), a "
            "cudaStream_t as an int, or None; got ",
            describe(arg));
  }
}

std::string describe_config(const ffi::dim3& grid, const ffi::dim3& block, int64_t shared_mem) {
  return detail::concat("grid=(", grid.x, ", ", grid.y, ", ", grid.z, "), block=(", block.x, ", ",
                        block.y, ", ", block.z, "), shared_mem=", shared_mem);
}

// ---------------------------------------------------------------------------
// The loaded image and its kernels.
// ---------------------------------------------------------------------------

/// A CUBIN, fatbin or NUL-terminated PTX image, loaded into every GPU's primary context
/// on first use there. The image bytes stay alive as long as the library.
class CudaLibraryObj : public ffi::Object {
 public:
  explicit CudaLibraryObj(ffi::Bytes image) : image_(std::move(image)), module_(image_) {}

  ffi::CubinKernel kernel(const std::string& name) const {
    ffi::cuda_api::KernelHandle handle = nullptr;
    const cudaError_t status = ffi::cuda_api::GetKernel(&handle, module_.GetHandle(), name.c_str());
    if (status == cudaErrorSymbolNotFound) {
      cudaGetLastError();  // not sticky: clear it
      raise("ValueError", "no kernel named '", name,
            "' in this module: is it declared extern \"C\" (C++ names are mangled)?");
    }
    if (status != cudaSuccess) {
      cudaGetLastError();
      raise("RuntimeError", "loading kernel '", name, "' failed: ", cuda_error_text(status));
    }
    return ffi::CubinKernel(module_.GetHandle(), name.c_str());
  }

  TVM_FFI_DECLARE_OBJECT_INFO_FINAL("mllm_kernel.runtime.CudaLibrary", CudaLibraryObj, ffi::Object);

 private:
  ffi::Bytes image_;
  ffi::CubinModule module_;
};

class CudaLibrary : public ffi::ObjectRef {
 public:
  explicit CudaLibrary(ffi::ObjectPtr<CudaLibraryObj> library) : ObjectRef(std::move(library)) {}
  TVM_FFI_DEFINE_OBJECT_REF_METHODS_NOTNULLABLE(CudaLibrary, ffi::ObjectRef, CudaLibraryObj);
};

constexpr int64_t kDefaultSharedMemLimit = 48 * 1024;
constexpr int kMaxDevices = 64;

/// One kernel with its parameters and default launch configuration. Shared by the
/// launch function's closure; thread-safe (the only state is per-device atomics).
class LaunchableKernel {
 public:
  LaunchableKernel(CudaLibrary library, std::string name, std::vector<Param> params, Dims grid,
                   Dims block, int64_t shared_mem)
      : library_(std::move(library)),
        kernel_(library_->kernel(name)),
        name_(std::move(name)),
        params_(std::move(params)),
        grid_(grid),
        block_(block),
        shared_mem_(shared_mem) {
    if (params_.size() > kMaxParams) {
      raise("ValueError", "kernel '", name_, "' has ", params_.size(),
            " parameters; the runtime launches kernels of at most ", kMaxParams);
    }
  }

  /// args: grid, block, shared_mem, stream, then the kernel's arguments.
  int launch(const ffi::AnyView* args, int num_args) {
    const Dims grid = parse_dims(args[0], "grid", grid_);
    const Dims block = parse_dims(args[1], "block", block_);
    if (!grid.given || !block.given) {
      raise("ValueError", "kernel '", name_, "': no ", grid.given ? "block" : "grid",
            " size: pass grid= and block= when compiling (the default) or when calling");
    }
    const int64_t shared_mem = parse_shared_mem(args[2], shared_mem_);
    PackedArgs packed;
    pack(params_, args + 4, num_args - 4, name_, packed);
    int device = packed.device;
    if (device < 0) TVM_FFI_CHECK_CUDA_ERROR(cudaGetDevice(&device));
    const cudaStream_t stream = parse_stream(args[3], device);
    ffi::CUDADeviceGuard guard(device);
    if (shared_mem > kDefaultSharedMemLimit) allow_shared_mem(device, shared_mem, grid, block);
    const cudaError_t status = kernel_.Launch(packed.pointers.data(), grid.value, block.value,
                                              stream, static_cast<uint32_t>(shared_mem));
    if (status != cudaSuccess) {
      cudaGetLastError();  // a configuration error is not sticky: clear it for others
      raise("RuntimeError", "launching kernel '", name_, "' on cuda:", device,
            " failed: ", cuda_error_text(status), " with ",
            describe_config(grid.value, block.value, shared_mem), config_hint(device, block.value));
    }
    return device;
  }

 private:
  /// Above 48 KiB a kernel must opt in to dynamic shared memory: once per device, raise
  /// its limit to all the device allows (the opt-in size less the kernel's static use).
  void allow_shared_mem(int device, int64_t bytes, const Dims& grid, const Dims& block) {
    std::atomic<int64_t>& allowed = allowed_shared_mem_[device % kMaxDevices];
    if (bytes <= allowed.load(std::memory_order_relaxed)) return;
    const int64_t limit = dynamic_shared_mem_limit(device);
    if (bytes > limit) {
      raise("RuntimeError", "launching kernel '", name_, "' on cuda:", device,
            " failed: cudaErrorInvalidValue: ", bytes,
            " bytes of dynamic shared memory requested, the device allows this kernel at most ",
            limit, " (its opt-in limit less the kernel's static shared memory), with ",
            describe_config(grid.value, block.value, bytes));
    }
    const cudaError_t status = ffi::cuda_api::SetKernelMaxDynamicSharedMem(
        kernel_.GetHandle(), static_cast<int>(limit), ffi::cuda_api::GetDeviceHandle(device));
    if (status != cudaSuccess) {
      cudaGetLastError();
      raise("RuntimeError", "kernel '", name_,
            "': setting cudaFuncAttributeMaxDynamicSharedMemorySize to ", limit,
            " on cuda:", device, " failed: ", cuda_error_text(status));
    }
    allowed.store(limit, std::memory_order_relaxed);
  }

  int64_t dynamic_shared_mem_limit(int device) const {
    int optin = 0;
    TVM_FFI_CHECK_CUDA_ERROR(
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    int static_bytes = 0;
    TVM_FFI_CHECK_CUBIN_LAUNCHER_CUDA_ERROR(ffi::cuda_api::GetKernelSharedMem(
        kernel_.GetHandle(), static_bytes, ffi::cuda_api::GetDeviceHandle(device)));
    return static_cast<int64_t>(optin) - static_bytes;
  }

  /// The device limit a failed configuration most likely broke, if any.
  static std::string config_hint(int device, const ffi::dim3& block) {
    int max_threads = 0;
    cudaDeviceGetAttribute(&max_threads, cudaDevAttrMaxThreadsPerBlock, device);
    const uint64_t threads = uint64_t{block.x} * block.y * block.z;
    if (max_threads > 0 && threads > static_cast<uint64_t>(max_threads)) {
      return detail::concat("; the block has ", threads, " threads, the device allows ",
                            max_threads);
    }
    return "";
  }

  CudaLibrary library_;
  ffi::CubinKernel kernel_;
  std::string name_;
  std::vector<Param> params_;
  Dims grid_;
  Dims block_;
  int64_t shared_mem_;
  std::array<std::atomic<int64_t>, kMaxDevices> allowed_shared_mem_{};
};

// ---------------------------------------------------------------------------
// Exported functions.
// ---------------------------------------------------------------------------

/// Loads a CUBIN/fatbin image or a PTX text (which must end with a NUL byte).
inline CudaLibrary load_image(ffi::Bytes image) {
  return CudaLibrary(ffi::make_object<CudaLibraryObj>(std::move(image)));
}

/// The launch function of kernel `name`; see LaunchableKernel::launch for its arguments.
inline ffi::Function get_kernel(CudaLibrary library, ffi::String name,
                                ffi::Array<ffi::String> kinds, ffi::Array<ffi::String> labels,
                                ffi::AnyView grid, ffi::AnyView block, int64_t shared_mem) {
  auto kernel = std::make_shared<LaunchableKernel>(
      std::move(library), std::string(name), parse_params(kinds, labels),
      parse_dims(grid, "grid", Dims{}), parse_dims(block, "block", Dims{}),
      checked_shared_mem(shared_mem));
  return ffi::Function::FromPacked([kernel](ffi::PackedArgs args, ffi::Any* result) {
    if (args.size() < 4) raise("TypeError", "launch takes grid, block, shared_mem, stream first");
    *result = kernel->launch(args.data(), args.size());
  });
}

/// The bytes `args` pack into for parameters `kinds` (one 8-byte slot each): the same
/// conversions and checks as a launch, without a GPU.
inline ffi::Bytes pack_arguments(ffi::Array<ffi::String> kinds, ffi::Array<ffi::String> labels,
                                 ffi::Array<ffi::Any> args) {
  const std::vector<Param> params = parse_params(kinds, labels);
  const std::vector<ffi::AnyView> views(args.begin(), args.end());
  PackedArgs packed;
  pack(params, views.data(), static_cast<int>(views.size()), "pack_arguments", packed);
  return ffi::Bytes(reinterpret_cast<const char*>(packed.slots.data()),
                    views.size() * sizeof(uint64_t));
}

/// Waits for `stream` on `device`, or for all of `device`'s work when `whole_device`.
inline void synchronize(int64_t device, int64_t stream, bool whole_device) {
  ffi::CUDADeviceGuard guard(static_cast<int>(device));
  const cudaError_t status =
      whole_device
          ? cudaDeviceSynchronize()
          : cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream)));
  if (status != cudaSuccess) {
    raise("RuntimeError", "synchronizing cuda:", device, " failed: ", cuda_error_text(status),
          " (an earlier kernel on it faulted)");
  }
}

/// What the driver reports about `device`, by the names device_info() uses.
inline ffi::Map<ffi::String, ffi::Any> device_properties(int64_t device) {
  const int id = static_cast<int>(device);
  int count = 0;
  TVM_FFI_CHECK_CUDA_ERROR(cudaGetDeviceCount(&count));
  if (id < 0 || id >= count) {
    raise("ValueError", "device ", device, " does not exist: ", count, " CUDA device(s) visible");
  }
  cudaDeviceProp properties{};
  TVM_FFI_CHECK_CUDA_ERROR(cudaGetDeviceProperties(&properties, id));
  ffi::Map<ffi::String, ffi::Any> out;
  out.Set("name", ffi::String(properties.name));
  out.Set("total_memory_bytes", static_cast<int64_t>(properties.totalGlobalMem));
  const std::pair<const char*, cudaDeviceAttr> attributes[] = {
      {"major", cudaDevAttrComputeCapabilityMajor},
      {"minor", cudaDevAttrComputeCapabilityMinor},
      {"sm_count", cudaDevAttrMultiProcessorCount},
      {"warp_size", cudaDevAttrWarpSize},
      {"max_threads_per_block", cudaDevAttrMaxThreadsPerBlock},
      {"max_threads_per_sm", cudaDevAttrMaxThreadsPerMultiProcessor},
      {"shared_memory_per_block", cudaDevAttrMaxSharedMemoryPerBlock},
      {"shared_memory_per_block_optin", cudaDevAttrMaxSharedMemoryPerBlockOptin},
      {"shared_memory_per_sm", cudaDevAttrMaxSharedMemoryPerMultiprocessor},
      {"registers_per_block", cudaDevAttrMaxRegistersPerBlock},
      {"registers_per_sm", cudaDevAttrMaxRegistersPerMultiprocessor},
      {"l2_cache_bytes", cudaDevAttrL2CacheSize},
      {"memory_clock_khz", cudaDevAttrMemoryClockRate},
      {"memory_bus_width_bits", cudaDevAttrGlobalMemoryBusWidth},
      {"cluster_launch", cudaDevAttrClusterLaunch},
  };
  for (const auto& [key, attribute] : attributes) {
    int value = 0;
    TVM_FFI_CHECK_CUDA_ERROR(cudaDeviceGetAttribute(&value, attribute, id));
    out.Set(key, static_cast<int64_t>(value));
  }
  return out;
}

}  // namespace mllm_kernel::cuda::runtime
