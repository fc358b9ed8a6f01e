// What llama.cpp's command-line parser (common/arg.cpp) calls in the model
// downloader, for scripts/mtmd-cli.mjs: the addon's llama.cpp is built
// without the downloader and cpp-httplib (patch 0013), and the reference
// `llama-mtmd-cli` the tests compare with is only ever given local files.
// Each stub refuses, so a download asked for by mistake fails loudly.
#include "download.h"
#include "hf-cache.h"

#include <stdexcept>

static std::runtime_error no_downloads() {
    return std::runtime_error("llama-mtmd-cli (tests): built without the downloader; give it local files");
}

// Called with the (empty) list of what local files leave to download.
void common_download_run_tasks(const std::vector<common_download_task> & tasks) {
    if (!tasks.empty()) {
        throw no_downloads();
    }
}
std::vector<std::string> common_download_get_all_parts(const std::string &) { throw no_downloads(); }
std::vector<common_cached_model_info> common_list_cached_models() { return {}; }
std::string common_docker_resolve_model(const std::string &) { throw no_downloads(); }
common_download_hf_plan common_download_get_hf_plan(const common_params_model &, const common_download_opts &) { throw no_downloads(); }

namespace hf_cache {
std::string finalize_file(const hf_file &) { throw no_downloads(); }
}
