// Internal: building report views from events, details and resolvers.
#pragma once

#include <string>

#include "opguard/aligner/report.h"
#include "opguard/aligner/trace.h"

namespace opguard::aligner {

std::string ResolveString(const StringResolver* strings, uint64_t id);
SiteInfo ResolveSite(const StringResolver* strings, uint64_t site_id);
OpView MakeOpView(uint32_t rank, uint32_t lane, const OpEvent& e, const DetailSource* details,
                  const StringResolver* strings);

}  // namespace opguard::aligner
