/*
 * A stand-in for libnvrtc.so used by the nvrtc package's tests.
 *
 * It has the real C prototypes. "Compiling" checks the options, fails with
 * NVRTC_ERROR_COMPILATION and a compiler-style log when the source contains
 * "#error", and otherwise produces a CUBIN that the fake driver would accept:
 * "FAKECUBIN", then ":name" for each extern "C" __global__ function, a NUL,
 * the options separated by spaces, and three raw bytes (0x00 0x01 0xff) so
 * that a copy which stops at the first NUL is caught.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvrtcResult;

enum {
	NVRTC_SUCCESS = 0,
	NVRTC_ERROR_OUT_OF_MEMORY = 1,
	NVRTC_ERROR_PROGRAM_CREATION_FAILURE = 2,
	NVRTC_ERROR_INVALID_INPUT = 3,
	NVRTC_ERROR_INVALID_PROGRAM = 4,
	NVRTC_ERROR_INVALID_OPTION = 5,
	NVRTC_ERROR_COMPILATION = 6,
	NVRTC_ERROR_BUILTIN_OPERATION_FAILURE = 7,
	NVRTC_ERROR_INTERNAL_ERROR = 11,
};

struct prog {
	char *src;
	char *name;
	char *log;
	char *cubin;
	size_t cubin_len;
	int compiled;
};
typedef struct prog *nvrtcProgram;

static int live_programs;
static int compiles;
static int last_nopts;
static char last_opts[16][128];

nvrtcResult nvrtcVersion(int *major, int *minor) {
	if (!major || !minor) return NVRTC_ERROR_INVALID_INPUT;
	*major = 12;
	*minor = 8;
	return NVRTC_SUCCESS;
}

nvrtcResult nvrtcCreateProgram(nvrtcProgram *p, const char *src, const char *name, int nheaders,
                               const char *const *headers, const char *const *include_names) {
	if (!p || !src) return NVRTC_ERROR_INVALID_INPUT;
	if (nheaders < 0 || (nheaders > 0 && (!headers || !include_names))) return NVRTC_ERROR_INVALID_INPUT;
	struct prog *pr = calloc(1, sizeof *pr);
	pr->src = strdup(src);
	pr->name = strdup(name ? name : "default_program");
	pr->log = strdup("");
	live_programs++;
	*p = pr;
	return NVRTC_SUCCESS;
}

nvrtcResult nvrtcDestroyProgram(nvrtcProgram *p) {
	if (!p || !*p) return NVRTC_ERROR_INVALID_PROGRAM;
	struct prog *pr = *p;
	free(pr->src);
	free(pr->name);
	free(pr->log);
	free(pr->cubin);
	free(pr);
	*p = NULL;
	live_programs--;
	return NVRTC_SUCCESS;
}

/* Appends ":name" for every `extern "C" __global__ void name(`. */
static size_t kernel_names(const char *src, char *out, size_t cap) {
	const char *marker = "extern \"C\" __global__ void ";
	size_t n = 0;
	for (const char *s = strstr(src, marker); s; s = strstr(s, marker)) {
		s += strlen(marker);
		size_t len = strcspn(s, "( ");
		if (n + len + 1 < cap) {
			out[n++] = ':';
			memcpy(out + n, s, len);
			n += len;
		}
	}
	return n;
}

nvrtcResult nvrtcCompileProgram(nvrtcProgram p, int nopts, const char *const *opts) {
	if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
	if (nopts < 0 || (nopts > 0 && !opts)) return NVRTC_ERROR_INVALID_INPUT;
	compiles++;
	last_nopts = nopts;
	for (int i = 0; i < nopts && i < 16; i++) {
		snprintf(last_opts[i], sizeof last_opts[i], "%s", opts[i]);
		if (opts[i][0] != '-') return NVRTC_ERROR_INVALID_OPTION;
	}
	const char *err = strstr(p->src, "#error");
	if (err) {
		int line = 1;
		for (const char *s = p->src; s < err; s++) line += *s == '\n';
		size_t len = strcspn(err, "\n");
		free(p->log);
		p->log = malloc(len + 256 + strlen(p->name) * 2);
		sprintf(p->log, "%s(%d): error: %.*s\n\n1 error detected in the compilation of \"%s\".\n",
		        p->name, line, (int)len, err, p->name);
		return NVRTC_ERROR_COMPILATION;
	}
	char names[512];
	size_t nn = kernel_names(p->src, names, sizeof names);
	size_t optlen = 0;
	for (int i = 0; i < nopts; i++) optlen += strlen(opts[i]) + 1;
	free(p->cubin);
	p->cubin = malloc(9 + nn + 1 + optlen + 3);
	size_t k = 0;
	memcpy(p->cubin, "FAKECUBIN", 9); k += 9;
	memcpy(p->cubin + k, names, nn); k += nn;
	p->cubin[k++] = '\0';
	for (int i = 0; i < nopts; i++) {
		size_t l = strlen(opts[i]);
		memcpy(p->cubin + k, opts[i], l); k += l;
		p->cubin[k++] = i + 1 < nopts ? ' ' : '\n';
	}
	p->cubin[k++] = 0x00; p->cubin[k++] = 0x01; p->cubin[k++] = (char)0xff;
	p->cubin_len = k;
	p->compiled = 1;
	free(p->log);
	p->log = strdup("");
	return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram p, size_t *n) {
	if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
	*n = strlen(p->log) + 1;
	return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetProgramLog(nvrtcProgram p, char *log) {
	if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
	if (!log) return NVRTC_ERROR_INVALID_INPUT;
	strcpy(log, p->log);
	return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetCUBINSize(nvrtcProgram p, size_t *n) {
	if (!p || !p->compiled) return NVRTC_ERROR_INVALID_PROGRAM;
	*n = p->cubin_len;
	return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetCUBIN(nvrtcProgram p, char *out) {
	if (!p || !p->compiled) return NVRTC_ERROR_INVALID_PROGRAM;
	if (!out) return NVRTC_ERROR_INVALID_INPUT;
	memcpy(out, p->cubin, p->cubin_len);
	return NVRTC_SUCCESS;
}

const char *nvrtcGetErrorString(nvrtcResult r) {
	switch (r) {
	case NVRTC_SUCCESS: return "NVRTC_SUCCESS";
	case NVRTC_ERROR_OUT_OF_MEMORY: return "NVRTC_ERROR_OUT_OF_MEMORY";
	case NVRTC_ERROR_PROGRAM_CREATION_FAILURE: return "NVRTC_ERROR_PROGRAM_CREATION_FAILURE";
	case NVRTC_ERROR_INVALID_INPUT: return "NVRTC_ERROR_INVALID_INPUT";
	case NVRTC_ERROR_INVALID_PROGRAM: return "NVRTC_ERROR_INVALID_PROGRAM";
	case NVRTC_ERROR_INVALID_OPTION: return "NVRTC_ERROR_INVALID_OPTION";
	case NVRTC_ERROR_COMPILATION: return "NVRTC_ERROR_COMPILATION";
	case NVRTC_ERROR_BUILTIN_OPERATION_FAILURE: return "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE";
	case NVRTC_ERROR_INTERNAL_ERROR: return "NVRTC_ERROR_INTERNAL_ERROR";
	}
	return "NVRTC_ERROR unknown";
}

/* Introspection for the tests. */
int fake_live_programs(void) { return live_programs; }
int fake_compiles(void) { return compiles; }
int fake_num_options(void) { return last_nopts; }
const char *fake_option(int i) { return i >= 0 && i < 16 ? last_opts[i] : ""; }
