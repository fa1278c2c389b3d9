#include "mixtrain/trainer/checkpoint_state.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <xxhash.h>

#include <cstdio>
#include <mutex>

namespace mixtrain {
namespace {

using json = nlohmann::json;

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string cpu_rng_state_hex() {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  const at::Tensor bytes = generator.get_state().contiguous();  // uint8
  std::string out;
  const auto* data = bytes.data_ptr<uint8_t>();
  for (int64_t i = 0; i < bytes.numel(); ++i) {
    char b[3];
    std::snprintf(b, sizeof(b), "%02x", data[i]);
    out += b;
  }
  return out;
}

at::Tensor cpu_rng_state_from_hex(const std::string& hex, const JsonFieldReader& reader,
                                  const std::string& field) {
  // The size this LibTorch writes (CPUGeneratorImplState); the legacy size it also reads is
  // never written by mixtrain.
  static const int64_t kBytes = [] {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    return generator.get_state().numel();
  }();
  if (static_cast<int64_t>(hex.size()) != 2 * kBytes) {
    reader.fail(field, "must be " + std::to_string(2 * kBytes) +
                           " hex digits (a CPU generator "
                           "state of " +
                           std::to_string(kBytes) + " bytes), got " + std::to_string(hex.size()));
  }
  at::Tensor bytes = at::empty({kBytes}, at::kByte);
  auto* data = bytes.data_ptr<uint8_t>();
  for (int64_t i = 0; i < kBytes; ++i) {
    const int high = hex_digit(hex[2 * i]), low = hex_digit(hex[2 * i + 1]);
    if (high < 0 || low < 0) {
      reader.fail(field, "character " + std::to_string(high < 0 ? 2 * i : 2 * i + 1) +
                             " is not a hex digit");
    }
    data[i] = static_cast<uint8_t>(high << 4 | low);
  }
  // LibTorch also checks the Mersenne Twister's fields (seeded, position in range); try it on a
  // generator of our own so that the default one is not touched.
  try {
    at::Generator scratch = at::make_generator<at::CPUGeneratorImpl>();
    scratch.set_state(bytes);
  } catch (const c10::Error&) {
    reader.fail(field,
                "is not a valid CPU generator state (its Mersenne Twister fields are out "
                "of range)");
  }
  return bytes;
}

SavedTrainingState read_training_state(const CheckpointMetadata& metadata, const std::string& where,
                                       std::vector<std::string>& problems) {
  const JsonFieldReader r(where);
  const json& state = metadata.state;
  SavedTrainingState out;
  // Each part is read on its own: a problem in one does not hide those of the others.
  auto part = [&](const char* name, const auto& read) {
    if (!collect(problems, read)) out.unread_parts.insert(name);
  };
  part("train", [&] {
    const json& train = r.object(state, "train", "state.train");
    out.step = r.integer(r.member(train, "step", "state.train.step"), "state.train.step", 0);
    if (out.step != metadata.step) {
      r.fail("state.train.step", std::to_string(out.step) + " but the checkpoint's step is " +
                                     std::to_string(metadata.step));
    }
  });

  part("lr_schedule", [&] {
    const json& lr = r.object(state, "lr_schedule", "state.lr_schedule");
    for (const char* name : {"warmup_steps", "total_steps"}) {
      const std::string field = std::string("state.lr_schedule.") + name;
      r.integer(r.member(lr, name, field), field, 0);
    }
    r.string(r.member(lr, "decay", "state.lr_schedule.decay"), "state.lr_schedule.decay");
    r.number(r.member(lr, "min_lr_ratio", "state.lr_schedule.min_lr_ratio"),
             "state.lr_schedule.min_lr_ratio");
  });

  part("data", [&] {
    const json& data = r.object(state, "data", "state.data");
    out.data_position =
        r.integer(r.member(data, "position", "state.data.position"), "state.data.position", 0);
    r.string(r.member(data, "description", "state.data.description"), "state.data.description");
  });

  if (state.contains("loss_scaler")) {
    part("loss_scaler", [&] {
      const json& s = r.object(state, "loss_scaler", "state.loss_scaler");
      SavedLossScaler scaler;
      scaler.scale =
          r.number(r.member(s, "scale", "state.loss_scaler.scale"), "state.loss_scaler.scale");
      if (!(scaler.scale > 0)) {
        r.fail("state.loss_scaler.scale", "must be > 0, got " + s.at("scale").dump());
      }
      scaler.growth_tracker =
          r.integer(r.member(s, "growth_tracker", "state.loss_scaler.growth_tracker"),
                    "state.loss_scaler.growth_tracker", 0);
      scaler.skipped_steps =
          r.integer(r.member(s, "skipped_steps", "state.loss_scaler.skipped_steps"),
                    "state.loss_scaler.skipped_steps", 0);
      out.loss_scaler = scaler;
    });
  }

  part("optimizer", [&] {
    const json& optimizer = r.object(state, "optimizer", "state.optimizer");
    out.optimizer_saved =
        r.boolean(r.member(optimizer, "saved", "state.optimizer.saved"), "state.optimizer.saved");
    out.fp32_main_params =
        r.boolean(r.member(optimizer, "fp32_main_params", "state.optimizer.fp32_main_params"),
                  "state.optimizer.fp32_main_params");
    const json& groups = r.list(r.member(optimizer, "param_groups", "state.optimizer.param_groups"),
                                "state.optimizer.param_groups");
    for (size_t i = 0; i < groups.size(); ++i) {
      if (!groups[i].is_object()) {
        r.fail("state.optimizer.param_groups[" + std::to_string(i) + "]",
               std::string("must be an object, got ") + groups[i].type_name());
      }
    }
    out.param_groups = groups;
  });

  part("config", [&] {
    const json& config = r.object(state, "config", "state.config");
    for (const auto& [key, value] : config.items()) {
      part("config", [&] { out.config[key] = r.string(value, "state.config." + key); });
    }
    // make_save_request hashes config.dump(); parsing and dumping again gives the same bytes.
    const std::string hash_text =
        r.string(r.member(state, "config_hash", "state.config_hash"), "state.config_hash");
    const auto hash = parse_xxh3_64(hash_text);
    if (!hash) r.fail("state.config_hash", "\"" + hash_text + "\" is not 16 hex digits");
    const std::string config_text = config.dump();
    const uint64_t actual = XXH3_64bits(config_text.data(), config_text.size());
    if (actual != *hash) {
      r.fail("state.config_hash",
             hash_text + " but state.config hashes to " + format_xxh3_64(actual));
    }
  });

  if (state.contains("ranks")) {
    const json& ranks = state.at("ranks");
    part("ranks", [&] { r.list(ranks, "state.ranks"); });
    for (size_t i = 0; ranks.is_array() && i < ranks.size(); ++i) {
      part("ranks", [&] {
        const std::string field = "state.ranks[" + std::to_string(i) + "]";
        if (!ranks[i].is_object()) {
          r.fail(field, std::string("must be an object, got ") + ranks[i].type_name());
        }
        const std::string hex =
            r.string(r.member(ranks[i], "rng_cpu", field + ".rng_cpu"), field + ".rng_cpu");
        out.rng_cpu.push_back(cpu_rng_state_from_hex(hex, r, field + ".rng_cpu"));
      });
    }
    // A rank whose state is bad leaves no entry: the list is then incomplete, never applied.
    if (out.rng_cpu.size() != (ranks.is_array() ? ranks.size() : 0)) out.rng_cpu.clear();
  }
  return out;
}

SavedTrainingState read_training_state(const CheckpointMetadata& metadata,
                                       const std::string& where) {
  std::vector<std::string> problems;
  SavedTrainingState out = read_training_state(metadata, where, problems);
  if (!problems.empty()) {
    std::string message;
    for (const auto& p : problems) message += (message.empty() ? "" : "\n") + p;
    throw DataError(message);
  }
  return out;
}

}  // namespace mixtrain
