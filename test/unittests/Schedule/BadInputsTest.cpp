//===- BadInputsTest.cpp - The malformed-input catalogue ------------------===//
//
// Drives every row of test/inputs/schedules/bad/README.md: the file must fail
// at the given stage with the given message substring and location.
//
//===----------------------------------------------------------------------===//

#include "hpr/Schedule/ScheduleFile.h"
#include "hpr/Schedule/Validate.h"

#include "TestUtil.h"

#include "llvm/ADT/StringExtras.h"

using namespace mlir::hpr::sched;
using namespace mlir::hpr::sched::test;

namespace {

struct BadCase {
  std::string file, dialect, stage, location, expected;
};

std::vector<BadCase> readCatalogue() {
  std::vector<BadCase> cases;
  llvm::SmallVector<llvm::StringRef> lines;
  std::string text = readInput("bad/README.md");
  llvm::StringRef(text).split(lines, '\n');
  for (llvm::StringRef line : lines) {
    if (!line.starts_with("| ") || line.starts_with("| file") ||
        line.starts_with("| ---"))
      continue;
    llvm::SmallVector<llvm::StringRef> cols;
    line.trim().trim('|').split(cols, " | ");
    if (cols.size() != 5)
      continue;
    llvm::StringRef expected = cols[4].trim();
    EXPECT_TRUE(expected.starts_with("`") && expected.ends_with("`"))
        << line.str();
    cases.push_back({cols[0].trim().str(), cols[1].trim().str(),
                     cols[2].trim().str(), cols[3].trim().str(),
                     expected.drop_front().drop_back().str()});
  }
  return cases;
}

TEST(BadInputs, CatalogueHasAtLeastFifteenFiles) {
  EXPECT_GE(readCatalogue().size(), 15u);
}

TEST(BadInputs, EachFileFailsWithItsMessage) {
  for (const BadCase &c : readCatalogue()) {
    std::string path = inputPath("bad/" + c.file);
    CsvDialect dialect =
        c.dialect == "legacy" ? CsvDialect::Legacy : CsvDialect::Current;
    auto s = readScheduleFile(path, dialect);
    std::string msg;
    if (c.stage == "parse") {
      ASSERT_FALSE(static_cast<bool>(s)) << c.file << " parsed";
      msg = errorText(s);
    } else {
      ASSERT_TRUE(static_cast<bool>(s)) << c.file << ": " << errorText(s);
      msg = errorText(validateSchedule(*s, path));
      ASSERT_NE(msg, "") << c.file << " validated";
    }
    EXPECT_NE(msg.find(c.expected), std::string::npos)
        << c.file << ": got " << msg;
    if (c.location != "-")
      EXPECT_EQ(msg.rfind(path + ":" + c.location + ": ", 0), 0u)
          << c.file << ": got " << msg;
    else
      EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << c.file << ": got " << msg;
  }
}

} // namespace
