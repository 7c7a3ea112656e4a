//===- Diagnostics.cpp - Diagnostics at schedule cells and plan paths -----===//

#include "hpr/Target/Diagnostics.h"

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Location.h"

using namespace mlir;

void mlir::hpr::printDiagnostic(Diagnostic &diag, llvm::raw_ostream &os,
                                llvm::StringRef tool) {
  Location where = diag.getLocation();
  auto name = dyn_cast<NameLoc>(where);
  auto cell = dyn_cast<FileLineColLoc>(name ? name.getChildLoc() : where);
  if (name && cell)
    os << cell.getFilename().getValue() << ": " << name.getName().getValue()
       << ": ";
  else if (cell && cell.getLine() > 0)
    os << cell.getFilename().getValue() << ":" << cell.getLine() << ":"
       << cell.getColumn() << ": ";
  else
    os << tool << ": ";
  switch (diag.getSeverity()) {
  case DiagnosticSeverity::Error:
    os << "error: ";
    break;
  case DiagnosticSeverity::Warning:
    os << "warning: ";
    break;
  case DiagnosticSeverity::Note:
    os << "note: ";
    break;
  case DiagnosticSeverity::Remark:
    os << "remark: ";
    break;
  }
  os << diag << "\n";
  for (Diagnostic &note : diag.getNotes())
    printDiagnostic(note, os, tool);
}
