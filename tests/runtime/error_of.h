#pragma once
// The code and message of the dhelix::Error a test body throws (a test failure when it
// throws none), for tests that check both.

#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "lib/error.h"

namespace dhelix::test {

template <typename Body>
std::pair<ErrorCode, std::string> error_of(Body body) {
  try {
    body();
  } catch (const Error& error) {
    return {error.code(), error.what()};
  }
  ADD_FAILURE() << "no Error thrown";
  return {ErrorCode::kInternal, ""};
}

}  // namespace dhelix::test
