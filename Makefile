# moeserve build. `make` / `make build` -> build/moeserve; `make test`; `make serve`; `make asan`;
# `make test-portable` (the plain C CPU paths, PORTABLE=1); `make fuzz` (libFuzzer, FUZZ_TIME s per
# target); `make soak` (the server under SOAK_N requests at concurrency 128); `make test-structured` (the
# whole structured-output schema corpus).
# The CUDA backend is compiled whenever nvcc is found (CUDA=0 to skip). All output goes to build/.

CC      ?= gcc
NVCC    ?= $(shell command -v nvcc 2>/dev/null || (test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc))
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
ifeq ($(NVCC),)
CUDA := 0
endif
CUDA    ?= 1
# Hopper machine code (wgmma needs sm_90a) plus PTX for other GPUs (JIT-compiled by the driver).
CUDA_ARCHS ?= -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_80,code=compute_80

BUILD   ?= build
OPT     ?= -O2
SAN     ?=
# CPU code paths are chosen at build time from the compiler's target macros (backend/cpu/cpu_kernels.h):
# AVX2+FMA+F16C on x86_64 (-march=x86-64-v3), NEON on aarch64 (baseline there, no flag needed).
# PORTABLE=1 builds the plain C paths instead, with no target flag (the CI checks them on x86).
PORTABLE ?= 0
TARGET_ARCH_NAME := $(firstword $(subst -, ,$(shell $(CC) -dumpmachine)))
MULTIARCH := $(or $(shell $(CC) -print-multiarch 2>/dev/null),$(shell $(CC) -dumpmachine))
ifeq ($(PORTABLE),1)
ARCH_FLAGS := -DMS_CPU_PORTABLE=1
else ifeq ($(TARGET_ARCH_NAME),x86_64)
ARCH_FLAGS := -march=x86-64-v3 -mtune=generic
else
ARCH_FLAGS :=
endif
DEPS_PKGS := jansson libmicrohttpd oniguruma libutf8proc libcurl libcrypto
CFLAGS_BASE := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wno-unused-parameter -Wno-sign-compare \
    -Wno-missing-field-initializers -Wno-format-truncation -fno-strict-aliasing -pthread -g $(OPT) $(ARCH_FLAGS) \
    -Isrc -I/usr/include/$(MULTIARCH)/openblas-pthread $(SAN) $(if $(findstring clang,$(CC)),-Wno-unknown-warning-option)
LDLIBS  := -ljansson -lmicrohttpd -lonig -lutf8proc -lopenblas -lcurl -lcrypto -lxxhash -lhwloc -lpthread -lm -ldl
LDFLAGS := $(SAN) -Wl,-rpath,'$$ORIGIN/lib'

ifeq ($(CUDA),1)
CFLAGS_BASE += -DMS_HAVE_CUDA=1
CUDA_INC := -I$(CUDA_HOME)/include
LDLIBS  += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lnccl -lcudart -lstdc++
NVFLAGS := -std=c++17 -O3 -lineinfo $(CUDA_ARCHS) -Isrc -Xcompiler -fPIC,-Wall --expt-relaxed-constexpr -Wno-deprecated-gpu-targets
# CU_TRACE=1: the in-graph kernel trace (src/backend/cuda/trace.cu; a diagnostic build, e.g. BUILD=build-trace)
ifeq ($(CU_TRACE),1)
NVFLAGS += -DMS_CU_TRACE=1
endif
endif
CFLAGS ?=
CFLAGS += $(CFLAGS_BASE)

# Library sources: every .c under src/; files under a cuda/ folder only with CUDA=1.
ALL_C    := $(shell find src -name '*.c' | sort)
# (filter patterns take one %, so "%/cuda/%" matched nothing: select by substring instead)
CUDA_C   := $(foreach f,$(ALL_C),$(if $(findstring /cuda/,$(f)),$(f)))
LIB_C    := $(filter-out $(CUDA_C),$(ALL_C))
LIB_CU   :=
ifeq ($(CUDA),1)
LIB_C    += $(CUDA_C)
LIB_CU   := $(shell find src -name '*.cu' | sort)
endif
LIB_OBJ  := $(LIB_C:%.c=$(BUILD)/%.o) $(LIB_CU:%.cu=$(BUILD)/%.cu.o)
TOOL_C   := $(shell find tools -name '*.c' | sort)
TOOL_OBJ := $(TOOL_C:%.c=$(BUILD)/%.o)
CFLAGS_TOOLS := -Itools
TEST_C   := $(shell find tests -name 'test_*.c' | sort)
TEST_BIN := $(TEST_C:tests/%.c=$(BUILD)/tests/%)

.PHONY: all build test test-portable test-structured serve asan fuzz soak format clean deps bench gpu-check check-deps install FORCE

# Rebuild everything when the compile flags change (e.g. CUDA=0 then CUDA=1 in one build dir).
FLAGS_STAMP := $(BUILD)/.flags
$(FLAGS_STAMP): FORCE
	@mkdir -p $(BUILD)
	@echo '$(CC) $(CFLAGS) $(NVFLAGS) $(LDLIBS)' | cmp -s - $@ || echo '$(CC) $(CFLAGS) $(NVFLAGS) $(LDLIBS)' > $@
all: build
build: $(BUILD)/moeserve $(TEST_BIN)

$(BUILD)/libmoeserve.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	@rm -f $@
	@echo "  AR      $@"
	@ar rcs $@ $^

$(BUILD)/moeserve: $(TOOL_OBJ) $(BUILD)/libmoeserve.a
	@echo "  LINK    $@"
	@$(CC) $(LDFLAGS) -o $@ $(TOOL_OBJ) $(BUILD)/libmoeserve.a $(LDLIBS)

$(BUILD)/tests/%: tests/%.c tests/test.h $(BUILD)/libmoeserve.a $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	@echo "  TEST    $@"
	@$(CC) $(CFLAGS) -Itests -MMD -MP -o $@ $< $(BUILD)/libmoeserve.a $(LDFLAGS) $(LDLIBS)

$(BUILD)/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	@$(CC) $(CFLAGS) -Itools $(if $(findstring /cuda/,$<),$(CUDA_INC)) -MMD -MP -c -o $@ $<

$(BUILD)/%.cu.o: %.cu $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	@echo "  NVCC    $<"
	@$(NVCC) $(NVFLAGS) -MMD -MP -c -o $@ $<

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

deps:
	@scripts/install-deps.sh

# The README's test command: installs what is missing, builds, checks the layer order, runs the CPU
# math layers on the portable kernels, then every test layer (its total is the last line).
test: deps
	@$(MAKE) --no-print-directory build
	@scripts/check-deps.sh
	@$(MAKE) --no-print-directory test-portable
	@tests/run.sh $(BUILD)

# The whole structured-output schema corpus (tests/e2e/schema_corpus.mjs, ~640 schemas x 3 samples at
# temperature 0 and 1, every finished reply validated by ajv); `make test` runs a 200-schema subset.
test-structured: deps
	@$(MAKE) --no-print-directory build
	@MS_BIN=$(CURDIR)/$(BUILD)/moeserve MS_CORPUS=full node tests/e2e/test_schema_corpus.mjs

# Installs the built binary as PREFIX/bin/moeserve (default /usr/local; DESTDIR for packaging) and
# the demo model and configs under PREFIX/share/moeserve, where `serve` finds the demo. It installs
# what `make build` made (BUILD=...), never rebuilding with other flags.
PREFIX ?= /usr/local
install:
	@test -x $(BUILD)/moeserve || { echo "make install: $(BUILD)/moeserve is not built; run make build (or pass BUILD=DIR)"; exit 1; }
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/moeserve/models/demo $(DESTDIR)$(PREFIX)/share/moeserve/configs
	install -m 755 $(BUILD)/moeserve $(DESTDIR)$(PREFIX)/bin/moeserve
	install -m 644 models/demo/* $(DESTDIR)$(PREFIX)/share/moeserve/models/demo/
	install -m 644 configs/*.json $(DESTDIR)$(PREFIX)/share/moeserve/configs/
	@echo "installed $(DESTDIR)$(PREFIX)/bin/moeserve; make sure $(PREFIX)/bin is on PATH"

# Fails on an include that goes up the layer order (DESIGN.md) or a CUDA header outside cuda/.
check-deps:
	@scripts/check-deps.sh

# Serves the built-in demo model on 127.0.0.1:8000 (PORT=... to change), speculating with the demo's
# own MTP layer (same output, 1.2-1.3x single-stream tokens/s on a 2-core CPU: bench/NOTES.md;
# SERVE_ARGS= turns it off, or passes other flags).
SERVE_ARGS ?= --speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4
serve: deps
	@$(MAKE) --no-print-directory build
	$(BUILD)/moeserve serve --port $${PORT:-8000} $(SERVE_ARGS)

# Whole test suite under AddressSanitizer + UndefinedBehaviorSanitizer (CPU build).
asan: deps
	@$(MAKE) --no-print-directory BUILD=build-asan CUDA=0 OPT=-O1 \
	  SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" build
	@ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 MS_ASAN=1 tests/run.sh build-asan

# The plain C CPU paths (PORTABLE=1, what a target without AVX2/NEON runs) through the test layers
# that do CPU math: core (threads), the CPU ops, the CPU MoE runner, and the model against the
# transformers fixtures. Only those test programs are built. No `deps`: `make test` runs it.
PORTABLE_TESTS := core,backend/test_cpu,moe/test_moe_cpu,model
test-portable:
	@$(MAKE) --no-print-directory BUILD=build-portable PORTABLE=1 CUDA=0 build-portable/moeserve \
	  $(filter $(addprefix build-portable/tests/,core/% backend/test_cpu% moe/test_moe_cpu% model/%), \
	    $(TEST_C:tests/%.c=build-portable/tests/%))
	@tests/run.sh build-portable $(PORTABLE_TESTS)

# libFuzzer targets (tests/fuzz/fuzz_*.c) under ASan/UBSan, built with clang into build-fuzz/, each
# run FUZZ_TIME seconds (FUZZ_TARGETS to pick some) on its seed corpus; crashes land in
# build-fuzz/fuzz-crashes/ and fail the run (add them to tests/fuzz/regress/TARGET/).
FUZZ_TIME ?= 30
FUZZ_C   := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BIN := $(FUZZ_C:tests/fuzz/%.c=build-fuzz/fuzz/%)
FUZZ_SAN := -fsanitize=address,undefined,fuzzer-no-link -fno-omit-frame-pointer -fno-sanitize-recover=undefined
fuzz:
	@$(MAKE) --no-print-directory CC=clang BUILD=build-fuzz CUDA=0 OPT=-O1 SAN="$(FUZZ_SAN)" $(FUZZ_BIN)
	@scripts/fuzz.sh build-fuzz $(FUZZ_TIME) $(FUZZ_TARGETS)

$(BUILD)/fuzz/%: tests/fuzz/%.c tests/fuzz/fuzz_util.h $(BUILD)/libmoeserve.a $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	@echo "  FUZZ    $@"
	@$(CC) $(CFLAGS) -fsanitize=fuzzer -Itests -o $@ $< $(BUILD)/libmoeserve.a $(LDFLAGS) $(LDLIBS)

# Soak test: SOAK_N requests (default 20000) at concurrency 128 against `moeserve serve` on the demo
# model, stopping by itself after SOAK_TIME seconds at most (scripts/soak.mjs).
SOAK_N ?= 20000
SOAK_TIME ?= 600
soak: build
	@node scripts/soak.mjs --bin $(BUILD)/moeserve --requests $(SOAK_N) --concurrency 128 --max-seconds $(SOAK_TIME)

bench: build
	@scripts/bench.sh $(BUILD)

gpu-check:
	@scripts/gpu-check.sh

format:
	clang-format -i $$(find src tools tests -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh')

clean:
	rm -rf build build-asan build-portable build-fuzz
