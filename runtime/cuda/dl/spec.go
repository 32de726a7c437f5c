package dl

// Spec describes one NVIDIA library: what to call it in messages, the
// environment variable that overrides the search, the sonames to try (most
// preferred first) and the subfolders of a Python site-packages folder where
// NVIDIA's wheels install it.
type Spec struct {
	Name      string
	EnvVar    string
	Sonames   []string
	WheelDirs []string
}

// The libraries the CUDA backend uses. The driver ships with the kernel
// module, never in a wheel, so it has no wheel folders. CUDA 13 wheels put
// every toolkit library in nvidia/cu13/lib, except NCCL, which keeps its own
// nvidia/nccl/lib.
var (
	CUDA = Spec{
		Name:    "CUDA driver",
		EnvVar:  "GCOMPILE_LIBCUDA",
		Sonames: []string{"libcuda.so.1", "libcuda.so"},
	}
	NVRTC = Spec{
		Name:      "NVRTC",
		EnvVar:    "GCOMPILE_LIBNVRTC",
		Sonames:   []string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"},
		WheelDirs: []string{"nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"},
	}
	CuBLASLt = Spec{
		Name:      "cuBLASLt",
		EnvVar:    "GCOMPILE_LIBCUBLASLT",
		Sonames:   []string{"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"},
		WheelDirs: []string{"nvidia/cu13/lib", "nvidia/cublas/lib"},
	}
	NCCL = Spec{
		Name:      "NCCL",
		EnvVar:    "GCOMPILE_LIBNCCL",
		Sonames:   []string{"libnccl.so.2", "libnccl.so"},
		WheelDirs: []string{"nvidia/nccl/lib", "nvidia/cu13/lib"},
	}
)
