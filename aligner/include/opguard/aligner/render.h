// Rendering of reports: stable JSON (docs/report-format.md, "format": 1) and
// short text readable like a compiler error (pivot first, then evidence).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "opguard/aligner/report.h"
#include "opguard/common/status.h"

namespace opguard::aligner {

inline constexpr int kReportFormat = 1;

nlohmann::json ToJson(const DiffReport& r);
nlohmann::json ToJson(const RankDiff& r);
nlohmann::json ToJson(const CollectivesReport& r);
nlohmann::json ToJson(const ReplicaReport& r);

std::string ToText(const DiffReport& r);
std::string ToText(const CollectivesReport& r);
std::string ToText(const ReplicaReport& r);

// "3f2a...": 32 hex digits, lo then hi, each as 16 big-endian digits.
std::string FpHex(const Fp128& fp);

}  // namespace opguard::aligner
