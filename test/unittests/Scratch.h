//===- Scratch.h - Folders a unit test writes into -------------*- C++ -*-===//
//
// Files the tests write go into one folder per test process, under the
// system's temporary folder, removed when the process exits (ctest runs each
// test in a process of its own): a run leaves nothing behind.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_TEST_UNITTESTS_SCRATCH_H
#define HPR_TEST_UNITTESTS_SCRATCH_H

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

#include <gtest/gtest.h>

#include <string>

namespace mlir::hpr::test {

/// A new, empty folder for one test's files.
inline std::string newScratchDir() {
  static struct Root {
    llvm::SmallString<128> path;
    Root() {
      EXPECT_FALSE(llvm::sys::fs::createUniqueDirectory("hpr-test", path));
    }
    ~Root() { llvm::sys::fs::remove_directories(path); }
  } root;
  static unsigned count = 0;
  llvm::SmallString<128> dir(root.path);
  llvm::sys::path::append(dir, std::to_string(count++));
  EXPECT_FALSE(llvm::sys::fs::create_directory(dir));
  return dir.str().str();
}

} // namespace mlir::hpr::test

#endif // HPR_TEST_UNITTESTS_SCRATCH_H
