//===- TestUtil.h - Helpers for the schedule unit tests ---------*- C++ -*-===//

#ifndef HPR_TEST_SCHEDULE_TESTUTIL_H
#define HPR_TEST_SCHEDULE_TESTUTIL_H

#include "hpr/Schedule/Schedule.h"
#include "hpr/Schedule/ScheduleCsv.h"

#include "llvm/Support/Error.h"
#include "llvm/Support/MemoryBuffer.h"

#include <gtest/gtest.h>

#include <string>

namespace mlir::hpr::sched::test {

/// The error text of `err` ("" for success); consumes it.
inline std::string errorText(llvm::Error err) {
  if (!err)
    return "";
  return llvm::toString(std::move(err));
}

template <typename T> std::string errorText(llvm::Expected<T> &value) {
  if (value)
    return "";
  return llvm::toString(value.takeError());
}

template <typename T> std::string errorText(llvm::Expected<T> &&value) {
  return errorText(value);
}

/// Path of a file under test/inputs/schedules.
inline std::string inputPath(const std::string &name) {
  return std::string(HPR_SCHEDULE_INPUTS) + "/" + name;
}

inline std::string readInput(const std::string &name) {
  auto buffer = llvm::MemoryBuffer::getFile(inputPath(name));
  EXPECT_TRUE(static_cast<bool>(buffer)) << name;
  return buffer ? (*buffer)->getBuffer().str() : std::string();
}

/// The schedule in CSV `text`, parsed (an empty schedule and a test failure
/// when it does not parse).
inline Schedule csv(const std::string &text,
                    CsvDialect dialect = CsvDialect::Current) {
  auto s = parseScheduleCsv(text, "t.csv", dialect);
  EXPECT_TRUE(static_cast<bool>(s)) << errorText(s);
  return s ? *s : Schedule();
}

} // namespace mlir::hpr::sched::test

#endif // HPR_TEST_SCHEDULE_TESTUTIL_H
