#include "opguard/aligner/diagnosis.h"

#include <algorithm>
#include <array>
#include <string>
#include <string_view>

namespace opguard::aligner {
namespace {

// Sorted: looked up by binary search.
constexpr std::array<std::string_view, 36> kDataMovementOps = {"aten::_reshape_alias",
                                                               "aten::_to_copy",
                                                               "aten::_unsafe_view",
                                                               "aten::alias",
                                                               "aten::as_strided",
                                                               "aten::cat",
                                                               "aten::chunk",
                                                               "aten::clone",
                                                               "aten::contiguous",
                                                               "aten::copy_",
                                                               "aten::detach",
                                                               "aten::detach_",
                                                               "aten::expand",
                                                               "aten::expand_as",
                                                               "aten::flatten",
                                                               "aten::lift_fresh",
                                                               "aten::mT",
                                                               "aten::movedim",
                                                               "aten::narrow",
                                                               "aten::numpy_T",
                                                               "aten::permute",
                                                               "aten::reshape",
                                                               "aten::select",
                                                               "aten::slice",
                                                               "aten::split",
                                                               "aten::squeeze",
                                                               "aten::stack",
                                                               "aten::t",
                                                               "aten::to",
                                                               "aten::transpose",
                                                               "aten::unbind",
                                                               "aten::unflatten",
                                                               "aten::unsqueeze",
                                                               "aten::view",
                                                               "aten::view_as",
                                                               "aten::split_with_sizes"};

std::string Where(const SiteInfo& s) {
  if (s.file.empty()) return s.function.empty() ? "an unknown line" : s.function;
  std::string out = s.file;
  if (s.line != 0) out += ":" + std::to_string(s.line);
  return out;
}

std::string OpAt(const OpView& v) { return v.op + " at " + Where(v.site); }

bool KernelsDiffer(const FirstDivergence& f) {
  const auto& r = f.reference.kernels;
  const auto& s = f.suspect.kernels;
  return !r.empty() && !s.empty() && r != s;
}

Diagnosis FromPivot(const FirstDivergence& f) {
  const std::string rank = "rank " + std::to_string(f.rank) + ", step " + std::to_string(f.step);
  if (f.op.rfind("opguard::replica_state[", 0) == 0) {
    return {"replica_state",
            "The replica state recorded after the optimizer step changed on " + rank +
                " while the other copy did not: memory corruption or a faulty device on this rank, "
                "or the "
                "update that wrote it.",
            ""};
  }
  if (f.code_changed) {
    return {"code_edit",
            "The code at the pivot differs between the runs: " + f.reference.op + " at " +
                Where(f.reference.site) + " in the reference was replaced by " + OpAt(f.suspect) +
                " in the suspect (other line text or other arguments; compare the input "
                "signatures). The edit is "
                "the cause.",
            ""};
  }
  if (f.inputs_equal && MovesDataOnly(f.op)) {
    return {"suspect_recording",
            f.op + " (" + Where(f.suspect.site) + ", " + rank +
                ") read identical inputs and only moves data, yet its recorded output differs: the "
                "recording is "
                "suspect (an output hashed after its memory was reused, or before its write "
                "landed), not the op. "
                "Record the suspect again; if it persists, report it with both runs.",
            ""};
  }
  if (f.inputs_equal && KernelsDiffer(f)) {
    return {"algorithm_selection",
            f.op + " (" + Where(f.suspect.site) + ", " + rank +
                ") read identical inputs and ran other kernels: the library chose another "
                "algorithm. Pin it "
                "(deterministic algorithms, the same library versions and settings) or accept the "
                "difference.",
            ""};
  }
  if (f.inputs_equal) {
    return {"op_itself",
            f.op + " (" + Where(f.suspect.site) + ", " + rank +
                ") read identical inputs and wrote different outputs: the op's own computation "
                "differs — a race in "
                "its kernel, silent data corruption on this rank's device, or a nondeterministic "
                "algorithm that "
                "preflight did not mark.",
            ""};
  }
  if (f.producer) {
    const OpView& p = *f.producer;
    return {"unpaired_producer",
            "An input of " + f.op + " (" + Where(f.suspect.site) + ", " + rank +
                ") was written by " + OpAt(p) + " (op #" + std::to_string(p.op_index) +
                "), which only the " + f.producer_run +
                " run executed: that extra or missing op is the cause.",
            ""};
  }
  if (f.trusted_candidate) {
    return {"trusted_producer",
            "An input of " + f.op + " (" + Where(f.suspect.site) + ", " + rank +
                ") differs and was probably written by trusted op " + OpAt(*f.trusted_candidate) +
                ", recorded without fingerprints: record again without OPGUARD_TRUSTED to confirm.",
            ""};
  }
  return {"unrecorded_producer",
          "The inputs of " + f.op + " (" + Where(f.suspect.site) + ", " + rank +
              ") already differed, written by something OpGuard did not record before it: code "
              "outside the "
              "framework's ops (NumPy, a C extension, an in-place write through .data), a side "
              "stream, or the "
              "data loader.",
          ""};
}

}  // namespace

bool MovesDataOnly(const std::string& op) {
  static const auto sorted = [] {
    auto v = kDataMovementOps;
    std::sort(v.begin(), v.end());
    return v;
  }();
  const std::string_view name = std::string_view(op).substr(0, op.find(" ["));
  return std::binary_search(sorted.begin(), sorted.end(), name);
}

std::optional<Diagnosis> Diagnose(const DiffReport& report) {
  if (!report.first_divergence) {
    if (report.incomplete_ranks.empty()) return std::nullopt;
    std::string ranks;
    for (uint32_t r : report.incomplete_ranks)
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    return Diagnosis{"missing_records",
                     "Records are missing on rank(s) " + ranks +
                         " where the runs may first differ: no cause can be named. Record again "
                         "(the shim's gaps say "
                         "why they were dropped).",
                     ""};
  }
  Diagnosis d = FromPivot(*report.first_divergence);
  if (!report.explained.empty()) {
    std::string ranks;
    for (const Explanation& e : report.explained) {
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(e.rank) + " (via " +
               (e.communicator_name.empty() ? "a collective" : e.communicator_name) + " seq " +
               std::to_string(e.seq) + ")";
    }
    d.spread =
        "It then reached rank(s) " + ranks + " through collectives; those ranks are not causes.";
  }
  return d;
}

}  // namespace opguard::aligner
